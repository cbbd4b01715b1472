import java.sql.*;

public class Meta {
    static void drain(ResultSet rs) throws SQLException {
        int n = rs.getMetaData().getColumnCount();
        int rows = 0;
        while (rs.next()) { for (int i = 1; i <= n; i++) rs.getObject(i); rows++; }
        rs.close();
    }
    public static void main(String[] args) throws Exception {
        String url = args[0];
        String step = args.length > 1 ? args[1] : "all";
        try (Connection c = DriverManager.getConnection(url, "alice", "")) {
            DatabaseMetaData md = c.getMetaData();
            System.out.println(md.getDatabaseProductVersion());
            if (step.equals("all") || step.equals("tables")) drain(md.getTables(null, null, "%", new String[]{"TABLE"}));
            if (step.equals("all") || step.equals("tables_null")) drain(md.getTables(null, "public", null, null));
            if (step.equals("all") || step.equals("columns")) drain(md.getColumns(null, null, "patients", "%"));
            if (step.equals("all") || step.equals("columns_all")) drain(md.getColumns(null, "public", "%", "%"));
            if (step.equals("all") || step.equals("schemas")) drain(md.getSchemas());
            if (step.equals("all") || step.equals("catalogs")) drain(md.getCatalogs());
            if (step.equals("all") || step.equals("tabletypes")) drain(md.getTableTypes());
            if (step.equals("all") || step.equals("typeinfo")) drain(md.getTypeInfo());
            if (step.equals("all") || step.equals("pk")) drain(md.getPrimaryKeys(null, null, "patients"));
            if (step.equals("all") || step.equals("imported")) drain(md.getImportedKeys(null, null, "visits"));
            if (step.equals("all") || step.equals("exported")) drain(md.getExportedKeys(null, null, "patients"));
            if (step.equals("all") || step.equals("index")) drain(md.getIndexInfo(null, null, "patients", false, true));
            if (step.equals("all") || step.equals("functions")) drain(md.getFunctions(null, null, "%"));
            if (step.equals("all") || step.equals("procedures")) drain(md.getProcedures(null, null, "%"));
            if (step.equals("all") || step.equals("udts")) drain(md.getUDTs(null, null, "%", null));
            if (step.equals("all") || step.equals("privs")) drain(md.getTablePrivileges(null, null, "patients"));
            if (step.equals("all") || step.equals("prepared")) {
                try (PreparedStatement ps = c.prepareStatement("SELECT COUNT(*) FROM patients WHERE age > ?")) {
                    for (int i = 0; i < 7; i++) { ps.setInt(1, 30 + i); drain(ps.executeQuery()); }
                }
                try (Statement st = c.createStatement()) { drain(st.executeQuery("SELECT version()")); }
                try (PreparedStatement ps = c.prepareStatement("SELECT current_schema(), current_database(), current_user")) {
                    drain(ps.executeQuery());
                }
            }
            if (step.equals("all") || step.equals("rsmeta")) {
                try (Statement st = c.createStatement(); ResultSet rs = st.executeQuery("SELECT patient_id, age, income FROM patients LIMIT 0")) {
                    ResultSetMetaData m = rs.getMetaData();
                    for (int i = 1; i <= m.getColumnCount(); i++) { m.getColumnTypeName(i); m.isNullable(i); m.isAutoIncrement(i); m.getTableName(i); m.getSchemaName(i); }
                }
            }
        }
    }
}
