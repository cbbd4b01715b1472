const { Client } = require('pg');
(async () => {
  const c = new Client({ host: '127.0.0.1', port: parseInt(process.argv[2]), user: 'alice', database: 'demo' });
  await c.connect();
  await c.query('SELECT version()');
  await c.query('SELECT current_database(), current_user, $1::int AS n', [5]);
  await c.query({ name: 'cnt', text: 'SELECT COUNT(*) FROM patients WHERE age > $1', values: [30] });
  await c.query("SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' ORDER BY table_name");
  await c.end();
})().catch(e => { console.error(e); process.exit(1); });
