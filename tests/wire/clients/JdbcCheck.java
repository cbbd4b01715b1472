// A pgjdbc session against dpproxy, as a JDBC BI tool drives it; run by tests/wire/test_clients.py.
//
//   java -cp <dir>:/usr/share/java/postgresql.jar JdbcCheck <jdbc url> <user> <password>
//
// It prints what it saw as lines of `key<TAB>value` (a key may repeat) and lets the Python test
// assert on them; it asserts nothing itself, so a surprise shows up as a value, not a stack trace.
// A step that fails prints `error<TAB><step>: <SQLState> <message>` and the program goes on.

import java.sql.Connection;
import java.sql.DatabaseMetaData;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.ResultSetMetaData;
import java.sql.SQLException;
import java.sql.SQLWarning;
import java.sql.Statement;
import java.util.Properties;
import org.postgresql.PGStatement;

public final class JdbcCheck {
    private JdbcCheck() {}

    /** One line: the key, then each value with tabs and newlines blanked out. */
    private static void out(String key, Object... values) {
        StringBuilder line = new StringBuilder(key);
        for (Object value : values) {
            line.append('\t').append(String.valueOf(value).replace('\t', ' ').replace('\n', ' '));
        }
        System.out.println(line);
    }

    private static String message(SQLWarning warning) {
        return warning == null ? "" : warning.getMessage();
    }

    private interface Step {
        void run() throws SQLException;
    }

    private static void step(String name, Step body) {
        try {
            body.run();
        } catch (SQLException e) {
            out("error", name + ": " + e.getSQLState() + " " + e.getMessage());
        }
    }

    private static void warnings(String key, SQLWarning warning) {
        for (SQLWarning w = warning; w != null; w = w.getNextWarning()) {
            out(key, w.getMessage());
        }
    }

    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.setProperty("user", args[1]);
        props.setProperty("password", args[2]);
        props.setProperty("ApplicationName", "JdbcCheck");
        try (Connection conn = DriverManager.getConnection(args[0], props)) {
            run(conn);
        }
    }

    private static void run(Connection conn) throws SQLException {
        DatabaseMetaData meta = conn.getMetaData();
        out("product", meta.getDatabaseProductName());
        out("product_version", meta.getDatabaseProductVersion());
        out("major", meta.getDatabaseMajorVersion());
        out("minor", meta.getDatabaseMinorVersion());

        step("version", () -> {
            try (Statement st = conn.createStatement(); ResultSet rs = st.executeQuery("SELECT version()")) {
                rs.next();
                out("version", rs.getString(1));
            }
        });

        step("count", () -> {
            try (Statement st = conn.createStatement();
                    ResultSet rs = st.executeQuery("SELECT COUNT(*) AS n FROM patients")) {
                ResultSetMetaData md = rs.getMetaData();
                out("count_column", md.getColumnLabel(1) + " " + md.getColumnTypeName(1));
                rs.next();
                out("count", rs.getLong(1));
                warnings("count_notice", st.getWarnings());
            }
        });

        // pgjdbc sends the first executions through the unnamed statement and, from the 5th
        // (prepareThreshold), Parses a named server-side statement once, then only Binds and
        // Executes it, asking for binary results. Each line: age, count, server-prepared?, notice.
        step("prepared", () -> {
            String sql = "SELECT COUNT(*) FROM patients WHERE age > ? AND sex = ?";
            try (PreparedStatement ps = conn.prepareStatement(sql)) {
                PGStatement pg = ps.unwrap(PGStatement.class);
                for (int i = 0; i < 8; i++) {
                    int age = 20 + 5 * i;
                    ps.setInt(1, age);
                    ps.setString(2, "F");
                    try (ResultSet rs = ps.executeQuery()) {
                        rs.next();
                        out("prepared", age, rs.getLong(1), pg.isUseServerPrepare(),
                                message(ps.getWarnings()));
                    }
                }
            }
        });

        // setDate, setBoolean and setBigDecimal: pgjdbc sends the date as text with a zone
        // ("2015-01-01 +00") and an unspecified type, the others typed; AVG comes back as numeric,
        // in binary once the statement is server-prepared.
        step("typed", () -> {
            String sql = "SELECT COUNT(*) AS n, AVG(income) AS mean_income FROM patients "
                    + "WHERE enrolled >= ? AND smoker = ? AND income < ?";
            try (PreparedStatement ps = conn.prepareStatement(sql)) {
                PGStatement pg = ps.unwrap(PGStatement.class);
                for (int i = 0; i < 6; i++) {
                    ps.setDate(1, java.sql.Date.valueOf("2015-01-01"));
                    ps.setBoolean(2, true);
                    ps.setBigDecimal(3, new java.math.BigDecimal("80000.50"));
                    try (ResultSet rs = ps.executeQuery()) {
                        rs.next();
                        out("typed", rs.getLong(1), rs.getBigDecimal(2), pg.isUseServerPrepare(),
                                message(ps.getWarnings()));
                    }
                }
            }
        });

        step("grouped", () -> {
            String sql = "SELECT sex, COUNT(*) AS n, AVG(income) AS mean_income FROM patients "
                    + "WHERE age >= ? GROUP BY sex ORDER BY sex";
            try (PreparedStatement ps = conn.prepareStatement(sql)) {
                ps.setInt(1, 18);
                try (ResultSet rs = ps.executeQuery()) {
                    ResultSetMetaData md = rs.getMetaData();
                    for (int c = 1; c <= md.getColumnCount(); c++) {
                        out("grouped_column", md.getColumnLabel(c) + " " + md.getColumnTypeName(c));
                    }
                    while (rs.next()) {
                        out("grouped", rs.getString(1) + " " + rs.getLong(2) + " " + rs.getBigDecimal(3));
                    }
                    warnings("grouped_notice", ps.getWarnings());
                }
            }
        });

        step("tables", () -> {
            try (ResultSet rs = meta.getTables(null, "public", "%", new String[] {"TABLE"})) {
                while (rs.next()) {
                    out("table", rs.getString("TABLE_SCHEM") + "." + rs.getString("TABLE_NAME") + " "
                            + rs.getString("TABLE_TYPE"));
                }
            }
        });

        step("columns", () -> {
            try (ResultSet rs = meta.getColumns(null, "public", "patients", "%")) {
                while (rs.next()) {
                    out("column", rs.getInt("ORDINAL_POSITION") + " " + rs.getString("COLUMN_NAME") + " "
                            + rs.getString("TYPE_NAME") + " " + rs.getInt("DATA_TYPE"));
                }
            }
        });

        step("schemas", () -> {
            try (ResultSet rs = meta.getSchemas()) {
                while (rs.next()) {
                    out("schema", rs.getString("TABLE_SCHEM"));
                }
            }
        });

        step("primary_keys", () -> {
            try (ResultSet rs = meta.getPrimaryKeys(null, "public", "patients")) {
                int count = 0;
                while (rs.next()) {
                    count++;
                }
                out("primary_keys", count);
            }
        });

        step("type_info", () -> {
            try (ResultSet rs = meta.getTypeInfo()) {
                int count = 0;
                boolean int4 = false;
                while (rs.next()) {
                    count++;
                    int4 |= "int4".equals(rs.getString("TYPE_NAME"));
                }
                out("type_info", count + " " + int4);
            }
        });

        // DBeaver sets the isolation level it is configured with and reads it back.
        step("isolation", () -> {
            out("isolation", conn.getTransactionIsolation());
            conn.setTransactionIsolation(Connection.TRANSACTION_SERIALIZABLE);
            out("isolation", conn.getTransactionIsolation());
            conn.setTransactionIsolation(Connection.TRANSACTION_READ_COMMITTED);
        });

        step("raw_rows", () -> {
            try (Statement st = conn.createStatement();
                    ResultSet rs = st.executeQuery("SELECT * FROM patients")) {
                out("raw_rows", "answered", rs.next());
            } catch (SQLException e) {
                out("raw_rows_sqlstate", e.getSQLState());
                out("raw_rows_message", e.getMessage());
            }
        });

        // Cursor-based reading as DBeaver does it: inside a transaction with a fetch size, pgjdbc
        // Executes the portal fetchSize rows at a time (PortalSuspended in between).
        step("cursor", () -> {
            conn.setAutoCommit(false);
            try (Statement st = conn.createStatement()) {
                st.setFetchSize(3);
                String sql = "SELECT department, COUNT(*) AS n FROM visits GROUP BY department "
                        + "ORDER BY department";
                try (ResultSet rs = st.executeQuery(sql)) {
                    while (rs.next()) {
                        out("cursor_row", rs.getString(1) + " " + rs.getLong(2));
                    }
                }
                try (ResultSet rs = st.executeQuery("SELECT zip, population FROM zip_info ORDER BY zip")) {
                    int rows = 0;
                    while (rs.next()) {
                        rows++;
                    }
                    out("cursor_public_rows", rows);
                }
                conn.commit();
            } finally {
                conn.setAutoCommit(true);
            }
        });

        step("settings", () -> {
            try (Statement st = conn.createStatement()) {
                st.execute("SET dpproxy.epsilon = 0.25");
                try (ResultSet rs = st.executeQuery("SHOW dpproxy.epsilon")) {
                    rs.next();
                    out("epsilon", rs.getString(1));
                }
                try (ResultSet rs = st.executeQuery("SELECT COUNT(*) FROM visits")) {
                    rs.next();
                    warnings("epsilon_notice", st.getWarnings());
                }
                try (ResultSet rs = st.executeQuery("SHOW dpproxy.budget")) {
                    ResultSetMetaData md = rs.getMetaData();
                    rs.next();
                    for (int c = 1; c <= md.getColumnCount(); c++) {
                        out("budget", md.getColumnLabel(c) + " " + rs.getString(c));
                    }
                }
                try {
                    st.execute("SET dpproxy.epsilon = 50");
                    out("epsilon_too_large", "accepted");
                } catch (SQLException e) {
                    out("epsilon_too_large", e.getSQLState());
                }
            }
        });
        out("done", "true");
    }
}
