// Zero-row probes through pgjdbc, as JDBC BI tools send them; run by tests/wire/test_probes.py.
//
//   java -cp <dir>:/usr/share/java/postgresql.jar ProbeCheck <jdbc url> <user> <password> <sql>...
//
// For each statement (numbered from 0) it prints what a tool reads before and after running it:
//   meta<TAB>i<TAB>name type,…           PreparedStatement.getMetaData() (Parse + Describe, no Execute)
//   exec<TAB>i<TAB>name type,…<TAB>rows  executeQuery()'s ResultSetMetaData and its row count
//   error<TAB>i<TAB>SQLSTATE message     a step that failed
// It asserts nothing itself: the Python test does.

import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.ResultSetMetaData;
import java.sql.SQLException;
import java.util.Properties;

public final class ProbeCheck {
    private ProbeCheck() {}

    private static String columns(ResultSetMetaData meta) throws SQLException {
        StringBuilder out = new StringBuilder();
        for (int i = 1; i <= meta.getColumnCount(); i++) {
            if (i > 1) {
                out.append(',');
            }
            out.append(meta.getColumnLabel(i)).append(' ').append(meta.getColumnTypeName(i));
        }
        return out.toString();
    }

    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.setProperty("user", args[1]);
        props.setProperty("password", args[2]);
        try (Connection conn = DriverManager.getConnection(args[0], props)) {
            for (int i = 3; i < args.length; i++) {
                int n = i - 3;
                try (PreparedStatement st = conn.prepareStatement(args[i])) {
                    ResultSetMetaData before = st.getMetaData();
                    System.out.println("meta\t" + n + "\t" + (before == null ? "null" : columns(before)));
                    try (ResultSet rs = st.executeQuery()) {
                        int rows = 0;
                        while (rs.next()) {
                            rows++;
                        }
                        System.out.println("exec\t" + n + "\t" + columns(rs.getMetaData()) + "\t" + rows);
                    }
                } catch (SQLException e) {
                    System.out.println("error\t" + n + "\t" + e.getSQLState() + " " + e.getMessage().replace('\n', ' '));
                }
            }
        }
        System.out.println("done");
    }
}
