// A node-postgres session against dpproxy; run by tests/wire/test_clients.py.
//
//   node pg_check.js <port> <user> <password>
//
// Prints one JSON object of what it saw and asserts nothing itself: the Python test does.
// A step that fails records {"error": {sqlstate, message}} in its place and the script goes on.
'use strict';

const { Client } = require('pg');
const Cursor = require('pg-cursor');

async function main() {
  const [port, user, password] = process.argv.slice(2);
  const client = new Client({
    host: '127.0.0.1', port: Number(port), user, password, database: 'demo', ssl: false,
  });
  const seen = { parameters: {}, notices: [] };  // notices: every NOTICE, in order
  client.connection.on('parameterStatus', (msg) => {
    seen.parameters[msg.parameterName] = msg.parameterValue;
  });
  client.on('notice', (msg) => { seen.notices.push(msg.message); });
  await client.connect();

  async function step(name, body) {
    try {
      seen[name] = await body();
    } catch (err) {
      seen[name] = { error: { sqlstate: err.code ?? null, message: err.message } };
    }
  }
  const fields = (result) => result.fields.map((f) => [f.name, f.dataTypeID]);

  // The NOTICEs a query sent (node-postgres emits them before the query's promise resolves).
  async function noticed(body) {
    const start = seen.notices.length;
    const result = await body();
    return [result, seen.notices.slice(start)];
  }

  await step('version', async () => (await client.query('SELECT version()')).rows[0].version);
  await step('count', async () => {
    const [result, notices] = await noticed(() => client.query('SELECT COUNT(*) AS n FROM patients'));
    return { fields: fields(result), rows: result.rows, notices };
  });
  // Values make node-postgres use the extended protocol (unnamed statement); a name makes it
  // prepare a named statement once and reuse it.
  await step('parameterised', async () => {
    const [result, notices] = await noticed(
      () => client.query('SELECT COUNT(*) AS n FROM patients WHERE age > $1 AND sex = $2', [40, 'F']),
    );
    return { fields: fields(result), rows: result.rows, notices };
  });
  await step('named', async () => {
    const out = [];
    for (const age of [20, 40, 60, 80]) {
      const [result, notices] = await noticed(() => client.query({
        name: 'count_older',
        text: 'SELECT sex, COUNT(*) AS n FROM patients WHERE age > $1 GROUP BY sex ORDER BY sex',
        values: [age],
      }));
      out.push({ age, rows: result.rows, notices });
    }
    return out;
  });
  // A JavaScript Date (sent as '2015-01-01T00:00:00.000+00:00' with TZ=UTC), a boolean and a
  // numeric string, all as text parameters of unspecified type.
  await step('typed', async () => {
    const [result, notices] = await noticed(() => client.query(
      'SELECT COUNT(*) AS n, AVG(income) AS mean_income FROM patients '
        + 'WHERE enrolled >= $1 AND smoker = $2 AND income < $3',
      [new Date(Date.UTC(2015, 0, 1)), true, '80000.50'],
    ));
    return { fields: fields(result), rows: result.rows, notices };
  });
  await step('columns', async () => {
    const result = await client.query(
      'SELECT column_name, data_type FROM information_schema.columns '
        + 'WHERE table_schema = $1 AND table_name = $2 ORDER BY ordinal_position',
      ['public', 'patients'],
    );
    return result.rows;
  });
  await step('tables', async () => {
    const result = await client.query(
      "SELECT c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        + "WHERE n.nspname = 'public' AND c.relkind = 'r' ORDER BY 1",
    );
    return result.rows.map((r) => r.relname);
  });
  await step('raw_rows', async () => {
    await client.query('SELECT * FROM patients');
    return 'answered';
  });
  await step('raw_rows_extended', async () => {
    await client.query('SELECT patient_id FROM patients WHERE age > $1', [30]);
    return 'answered';
  });
  // pg-cursor: a portal read a few rows per Execute, inside a transaction.
  await step('cursor', async () => {
    await client.query('BEGIN');
    const cursor = client.query(
      new Cursor(
        'SELECT department, COUNT(*) AS n FROM visits WHERE cost >= $1 '
          + 'GROUP BY department ORDER BY department',
        [0],
      ),
    );
    const pages = [];
    for (;;) {
      const rows = await cursor.read(3);
      if (rows.length === 0) break;
      pages.push(rows);
    }
    await cursor.close();
    await client.query('COMMIT');
    return pages;
  });
  await step('budget', async () => {
    await client.query('SET dpproxy.epsilon = 0.3');
    const epsilon = (await client.query('SHOW dpproxy.epsilon')).rows[0];
    const [, notices] = await noticed(() => client.query('SELECT COUNT(*) FROM visits'));
    const budget = (await client.query('SHOW dpproxy.budget')).rows[0];
    return { epsilon, notices, budget };
  });
  await client.end();
  process.stdout.write(JSON.stringify(seen) + '\n');
}

main().catch((err) => {
  process.stderr.write(`pg_check failed: ${err.stack || err}\n`);
  process.exit(1);
});
