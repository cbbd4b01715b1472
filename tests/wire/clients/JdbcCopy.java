// pgjdbc's CopyManager against dpproxy, as a JVM tool exports a query; run by tests/wire/test_scripts.py.
//
//   java -cp <dir>:/usr/share/java/postgresql.jar JdbcCopy <jdbc url> <user> <password> <COPY … TO STDOUT>
//
// Prints the rows COPY sent, then `rows<TAB><count>` (CopyManager's count, from "COPY n"), or
// `error<TAB><SQLState> <message>` when the statement is refused.

import java.io.ByteArrayOutputStream;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.SQLException;
import java.util.Properties;
import org.postgresql.PGConnection;
import org.postgresql.copy.CopyManager;

public final class JdbcCopy {
    private JdbcCopy() {}

    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.setProperty("user", args[1]);
        props.setProperty("password", args[2]);
        try (Connection conn = DriverManager.getConnection(args[0], props)) {
            CopyManager copy = conn.unwrap(PGConnection.class).getCopyAPI();
            ByteArrayOutputStream rows = new ByteArrayOutputStream();
            try {
                long count = copy.copyOut(args[3], rows);
                System.out.print(rows.toString(StandardCharsets.UTF_8));
                System.out.println("rows\t" + count);
            } catch (SQLException e) {
                System.out.println("error\t" + e.getSQLState() + " " + e.getMessage().replace('\n', ' '));
            }
        }
    }
}
