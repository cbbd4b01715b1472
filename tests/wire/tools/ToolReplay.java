// Replays a JVM BI tool's SQL sequence through pgjdbc; run by tests/wire/tools/jvm.py.
//
//   java -cp <dir>:/usr/share/java/postgresql.jar ToolReplay <jdbc url> <user> <password> < steps
//
// Each line of standard input is one step: `name<TAB>kind<TAB>argument<TAB>argument…`, with `\n`,
// `\t` and `\\` escaped in every field. Kinds:
//   query  SQL             Statement.execute, as a tool runs a query it built as text;
//   prepared SQL P…        PreparedStatement with parameters `s:text`, `i:int`, `l:long`, `b:bool`;
//   meta   METHOD A…       a DatabaseMetaData call (getTables, getColumns, getPrimaryKeys,
//                          getImportedKeys, getIndexInfo, getSchemas, getCatalogs), `-` is null.
// For each step it prints `step<TAB>name`, then `column<TAB>label<TAB>type name` per result column,
// `row<TAB>v1<TAB>v2…` per row (at most MAX_ROWS), `rows<TAB>n`, `notice<TAB>message` per
// warning and, when the step fails, `error<TAB>SQLSTATE<TAB>message`. It asserts nothing: the
// Python tests do, so a surprise shows up as a value, not a stack trace.

import java.sql.Connection;
import java.sql.DatabaseMetaData;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.ResultSetMetaData;
import java.sql.SQLException;
import java.sql.SQLWarning;
import java.sql.Statement;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;

public final class ToolReplay {
    private static final int MAX_ROWS = 200;

    private ToolReplay() {}

    private static String escape(Object value) {
        if (value == null) {
            return "\\N";
        }
        return String.valueOf(value).replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n");
    }

    private static String unescape(String field) {
        StringBuilder out = new StringBuilder();
        for (int i = 0; i < field.length(); i++) {
            char c = field.charAt(i);
            if (c == '\\' && i + 1 < field.length()) {
                char next = field.charAt(++i);
                out.append(next == 'n' ? '\n' : next == 't' ? '\t' : next);
            } else {
                out.append(c);
            }
        }
        return out.toString();
    }

    private static void out(String key, Object... values) {
        StringBuilder line = new StringBuilder(key);
        for (Object value : values) {
            line.append('\t').append(escape(value));
        }
        System.out.println(line);
    }

    private static void warnings(SQLWarning warning) {
        for (SQLWarning w = warning; w != null; w = w.getNextWarning()) {
            out("notice", w.getMessage());
        }
    }

    private static void results(ResultSet rs) throws SQLException {
        ResultSetMetaData md = rs.getMetaData();
        int n = md.getColumnCount();
        for (int i = 1; i <= n; i++) {
            out("column", md.getColumnLabel(i), md.getColumnTypeName(i));
        }
        int count = 0;
        while (rs.next()) {
            if (count++ < MAX_ROWS) {
                Object[] values = new Object[n];
                for (int i = 1; i <= n; i++) {
                    values[i - 1] = rs.getString(i);
                }
                out("row", values);
            }
        }
        out("rows", count);
    }

    private static String nullable(String value) {
        return "-".equals(value) ? null : value;
    }

    private static ResultSet meta(DatabaseMetaData md, String[] a) throws SQLException {
        switch (a[0]) {
            case "getTables":
                return md.getTables(nullable(a[1]), nullable(a[2]), nullable(a[3]),
                        a.length > 4 ? a[4].split(",") : null);
            case "getColumns":
                return md.getColumns(nullable(a[1]), nullable(a[2]), nullable(a[3]), nullable(a[4]));
            case "getPrimaryKeys":
                return md.getPrimaryKeys(nullable(a[1]), nullable(a[2]), a[3]);
            case "getImportedKeys":
                return md.getImportedKeys(nullable(a[1]), nullable(a[2]), a[3]);
            case "getIndexInfo":
                return md.getIndexInfo(nullable(a[1]), nullable(a[2]), a[3], false, true);
            case "getSchemas":
                return md.getSchemas();
            case "getCatalogs":
                return md.getCatalogs();
            default:
                throw new IllegalArgumentException("unknown DatabaseMetaData call " + a[0]);
        }
    }

    private static void bind(PreparedStatement ps, List<String> params) throws SQLException {
        for (int i = 0; i < params.size(); i++) {
            String p = params.get(i);
            String value = p.substring(2);
            switch (p.charAt(0)) {
                case 'i':
                    ps.setInt(i + 1, Integer.parseInt(value));
                    break;
                case 'l':
                    ps.setLong(i + 1, Long.parseLong(value));
                    break;
                case 'b':
                    ps.setBoolean(i + 1, Boolean.parseBoolean(value));
                    break;
                default:
                    ps.setString(i + 1, value);
            }
        }
    }

    private static void run(Connection conn, String name, String kind, List<String> args) {
        out("step", name);
        try {
            if (kind.equals("query")) {
                try (Statement st = conn.createStatement()) {
                    boolean hasRows = st.execute(args.get(0));
                    warnings(st.getWarnings());
                    if (hasRows) {
                        try (ResultSet rs = st.getResultSet()) {
                            results(rs);
                        }
                    } else {
                        out("updated", st.getUpdateCount());
                    }
                }
            } else if (kind.equals("prepared")) {
                try (PreparedStatement ps = conn.prepareStatement(args.get(0))) {
                    bind(ps, args.subList(1, args.size()));
                    try (ResultSet rs = ps.executeQuery()) {
                        warnings(ps.getWarnings());
                        results(rs);
                    }
                }
            } else if (kind.equals("meta")) {
                try (ResultSet rs = meta(conn.getMetaData(), args.toArray(new String[0]))) {
                    results(rs);
                }
            } else {
                throw new IllegalArgumentException("unknown step kind " + kind);
            }
        } catch (SQLException e) {
            out("error", e.getSQLState(), e.getMessage());
        }
    }

    public static void main(String[] argv) throws Exception {
        Properties props = new Properties();
        props.setProperty("user", argv[1]);
        props.setProperty("password", argv[2]);
        props.setProperty("ApplicationName", "ToolReplay");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        try (Connection conn = DriverManager.getConnection(argv[0], props)) {
            conn.setAutoCommit(true);
            String line;
            while ((line = in.readLine()) != null) {
                if (line.isEmpty()) {
                    continue;
                }
                String[] fields = line.split("\t", -1);
                List<String> args = new ArrayList<>();
                for (int i = 2; i < fields.length; i++) {
                    args.add(unescape(fields[i]));
                }
                run(conn, unescape(fields[0]), fields[1], args);
            }
        }
        out("done", "true");
    }
}
