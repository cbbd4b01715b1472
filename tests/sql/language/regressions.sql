-- Statements the query-language generator once found failing; tests/sql/test_language.py runs them all.
-- One per line; parameters after ' -- params: ' as a Python list. The comment above each says what broke.
-- A table function in FROM crashed the analyzer (AttributeError, XX000).
SELECT AVG(p.income), CAST(MEDIAN(income) AS text), AVG(p.income) AS n FROM patients p CROSS JOIN generate_series(1, 3) g ORDER BY 4 ASC LIMIT 3
SELECT substring(zip, 1, 2) AS k0, SUM(p.income) FROM generate_series(1, 2) g JOIN patients p ON p.age = g WHERE zip = ANY(ARRAY['flu', 'cold']) GROUP BY k0, p.smoker HAVING SUM("p"."income") > 2.5
-- A numeric constant or parameter in ORDER BY crashed the analyzer (ValueError).
SELECT MIN((duration % length((b.zip || $1)))) FROM visits a INNER JOIN "patients" b ON a.patient_id = b.patient_id WHERE b.smoker ORDER BY 0.5 DESC -- params: ['er']
SELECT MIN(sub.duration)::int4 AS n, MEDIAN(duration) AS a1, ROUND(AVG(duration), 1) AS a2 FROM (SELECT patient_id, department, duration FROM visits WHERE TRUE) sub ORDER BY $1 NULLS FIRST LIMIT 1 -- params: [2.5]
-- round() of an unbounded per-person count crashed the interval arithmetic (InvalidOperation).
WITH sub AS (SELECT patient_id, COUNT(*) AS n FROM patients GROUP BY patient_id) SELECT COUNT(' flu ') + (SELECT MIN(z2.population) FROM zip_info z2) AS a0, SUM((sub.n - round(sub.n))) FROM sub LIMIT NULL OFFSET 1
SELECT COUNT(n) AS n, MIN(round(n, 1)) AS a1 FROM (SELECT patient_id, COUNT(*) AS n, SUM(duration) AS total, AVG(duration) AS mean, MAX(duration) AS top FROM visits GROUP BY patient_id) d WHERE FALSE GROUP BY d.n ORDER BY SUM((n * -mean))
-- A subquery over a public table was emitted inside the protected table's scope: outer aliases and raw columns bound to protected rows.
SELECT COUNT("a"."state") * 0 AS n, COUNT(*) FROM zip_info a LEFT JOIN "patients" b ON a.zip = b.zip WHERE a.state IN (SELECT q.zip FROM zip_info q WHERE q.state = a.zip) LIMIT 0
SELECT b.zip IN (SELECT zz.zip FROM zip_info zz WHERE zz.population = b.patient_id), population, extract(year FROM b.birth) AS k2, SUM(b.score) AS a0 FROM zip_info AS a LEFT OUTER JOIN patients b ON a.zip = b.zip WHERE b.smoker GROUP BY 1, population, 3 ORDER BY 4 ASC
SELECT COUNT(*) FROM patients p WHERE zip IN (SELECT zip FROM zip_info WHERE 1 / (income - 12345) > 0)
SELECT COUNT(*) FROM patients p WHERE zip IN (SELECT zip FROM zip_info WHERE CAST(income AS smallint) > 0)
SELECT COUNT(*), AVG((SELECT z2.population FROM zip_info z2 WHERE income > 0)) FROM patients
SELECT zip IN (SELECT zip FROM zip_info WHERE 1 / (age - 30) > 0) AS k, COUNT(*) FROM patients GROUP BY 1
SELECT diagnosis, COUNT(*) FROM patients GROUP BY diagnosis HAVING diagnosis IN (SELECT state FROM zip_info WHERE population / (income - 1) > 0)
-- A protected table on the nullable side of a LEFT JOIN: unmatched public rows became one pseudo-person.
SELECT a.zip, a.state NOT IN (SELECT z2.zip FROM zip_info z2 WHERE patient_id > 0) AS k1, SUM(CASE WHEN b.smoker THEN 1 ELSE 0 END) AS n, COUNT(*) AS n FROM "zip_info" a LEFT OUTER JOIN patients b ON a.zip = b.zip GROUP BY a.zip, a.state NOT IN (SELECT z2.zip FROM zip_info z2 WHERE patient_id > 0) ORDER BY k1 DESC OFFSET 1 -- params: [1]
SELECT substring(diagnosis, 1, 2), b.smoker, COUNT(-2.5) AS a0 FROM zip_info AS a LEFT JOIN patients b ON a.zip = b.zip WHERE TRUE GROUP BY substring(diagnosis, 1, 2), 2
-- SUM of a wide decimal constant overflowed DuckDB's DECIMAL(18) when put on the grid.
SELECT ROUND(AVG(s.rating), 0), SUM(123456789.123456789) AS n FROM "survey" s GROUP BY s.answer
-- Doubles were rounded half to even on PostgreSQL and half away from zero on DuckDB (sums and histogram bins).
SELECT patients.birth AS k0, patients.zip, SUM(patients.score) AS a0 FROM "patients" GROUP BY patients.birth, patients.zip
SELECT NULL, MEDIAN(a.score) AS n FROM public.patients a JOIN patients b ON a.patient_id = b.patient_id
SELECT MIN(a.age)::int4 AS a0, VAR_SAMP(a.score) AS a1 FROM "patients" a LEFT JOIN visits b ON a.patient_id = b.patient_id AND score BETWEEN 9223372036854775807 AND 123456789.123456789 HAVING (COUNT(*) > 1 AND SUM(income) < 100)
SELECT COALESCE(MIN(p.score), 0), COUNT(*) FROM patients p
-- CAST(boolean AS smallint) was accepted; PostgreSQL has no such cast.
SELECT SUM(CASE WHEN smoker THEN 1 ELSE 0 END) - 0 AS n, (100.005 % CAST(b.smoker AS smallint)) AS k0, COUNT(*) FROM patients b GROUP BY (100.005 % CAST(b.smoker AS smallint)) LIMIT 0
-- LEAST/GREATEST skipped NULLs on PostgreSQL but were emitted NULL-propagating for DuckDB.
SELECT SUM(income) / SUM(score) AS a0 FROM public.patients a INNER JOIN visits b ON a.patient_id = b.patient_id ORDER BY SUM((age - least((a.income - cost), CASE WHEN a.smoker THEN a.age ELSE a.score END))) DESC OFFSET 0 -- params: [1]
-- COLLATE in a BETWEEN bound is a syntax error on PostgreSQL; COLLATE on a boolean or a NULL-typed value fails.
SELECT SUM(a.cost) AS n, b.smoker, (visit_id / 10) FROM public.visits a JOIN patients b ON a.patient_id = b.patient_id WHERE CAST(b.diagnosis IN (SELECT z2.state FROM zip_info z2 WHERE z2.population <> -1) AS varchar) BETWEEN '%' AND 'LONELY' GROUP BY b.smoker, 3 LIMIT 3
SELECT SUM(CASE WHEN t.department BETWEEN 'CA' AND $1 THEN 1 ELSE 0 END) + (SELECT MIN(z2.population) FROM zip_info z2) AS a0, COUNT(DISTINCT extract(year FROM TIMESTAMP '2022-01-01 12:00:00')) AS a1 FROM "visits" t WHERE FALSE -- params: ['er']
SELECT (b.duration / 10), COUNT(CASE WHEN FALSE <= FALSE > NULL THEN nullif((0.0 % a.duration), CASE WHEN TRUE THEN $1 ELSE b.duration END) ELSE a.duration END) AS a0 FROM visits AS a JOIN visits b ON a.patient_id = b.patient_id WHERE FALSE GROUP BY (b.duration / 10) ORDER BY (b.duration / 10) DESC -- params: [1]
SELECT AVG("s"."temperature") FROM (SELECT patient_id, department, duration, temperature, visits.visit_id AS computed FROM visits) s WHERE ('yes' || NULL) BETWEEN '' AND '%' LIMIT 2
-- DuckDB computes % of decimals of different scales in double precision.
SELECT SUM(cost) AS n, SUM((a.score - mod(income, 1)))::int4 AS a1 FROM patients a LEFT JOIN "visits" b ON a.patient_id = b.patient_id WHERE a.smoker
-- extract(hour FROM date) fails on PostgreSQL.
SELECT s.rating AS k0, s.answer AS k1, COUNT(rating) AS a0, COALESCE(SUM((extract(hour FROM DATE '2023-06-01') / (greatest(s.rating, s.rating) * rating))), 0) AS n FROM public.survey s WHERE TRUE GROUP BY s.rating, s.answer ORDER BY 4 LIMIT NULL
-- Chained comparisons were re-emitted without parentheses.
SELECT department AS k0, MAX(10) AS a0 FROM visits v WHERE visit_date >= NULL != NOT EXISTS (SELECT 1 FROM zip_info zz WHERE zz.state <> ' flu ') GROUP BY department
SELECT SUM(cost) AS a0 FROM "patients" a LEFT JOIN visits b ON a.patient_id = b.patient_id AND "a"."income" > 1.5e-3 > FALSE JOIN "zip_info" c ON a.patient_id = c.population HAVING COUNT(duration) < 2.5 LIMIT 10
-- A CAST of a constant text expression to smallint failed in the backend.
SELECT visits.duration, AVG(-visits.cost) AS n, SUM(abs(visits.duration)) FROM visits WHERE CAST(left('é', -2) AS smallint) <= visits.cost GROUP BY visits.visit_date, visits.duration
-- A round(double) inside another reached the backend as an unspelled marker function.
SELECT CAST(AVG(round(abs(round(temperature)))) AS bigint) FROM "visits" AS v
-- Dates and times Python cannot hold (±infinity, years past 9999): read back, cast or extracted from, they failed.
SELECT birth, extract(year FROM seen) AS y, COUNT(*) FROM patients GROUP BY 1, 2
SELECT date_trunc('month', seen) AS m, CAST(birth AS timestamp) AS b, COUNT(*) FROM patients GROUP BY 1, 2
-- The same subquery inlined twice with its rows in two orders: the select-list key no longer matched GROUP BY.
SELECT CASE WHEN t.zip IN (SELECT zz.state FROM zip_info zz WHERE zz.population <> 3 GROUP BY zz.state HAVING COUNT(*) <= 1) THEN 'x' ELSE 'y' END AS k1, AVG($1) AS a0 FROM public.patients t GROUP BY t.score, CASE WHEN t.zip IN (SELECT zz.state FROM zip_info zz WHERE zz.population <> 3 GROUP BY zz.state HAVING COUNT(*) <= 1) THEN 'x' ELSE 'y' END -- params: [40]
-- Found by the adversarial review. Equal keys spelled by whichever row came first (-0.0 / 0.0; numeric 30 / 30.00).
SELECT CAST(ceil((CASE WHEN zip = 'LONELY' THEN -1 ELSE 0 END) / 2.0) AS double precision) AS k, COUNT(*) FROM patients GROUP BY 1
SELECT CASE WHEN zip = 'LONELY' THEN 30 ELSE income END AS k, COUNT(*) FROM patients GROUP BY 1
-- Constant arithmetic ran in smallint/int4 on DuckDB and failed only on the rows that reached it. It is computed in bigint; a constant that leaves its own type is refused as PostgreSQL's planner refuses it (22003), whatever the data.
SELECT COUNT(*) FROM patients WHERE CASE WHEN zip = 'LONELY' THEN CAST(32767 AS smallint) + CAST(1 AS smallint) ELSE 0 END > 0
SELECT COUNT(*) FROM patients WHERE CASE WHEN zip = 'LONELY' THEN CAST(-32768 AS smallint) / CAST(-1 AS smallint) ELSE 0 END > 0
SELECT COUNT(*) FROM patients WHERE 2147483647 * 2 > age AND abs(-2147483648) > 0
SELECT COUNT(*) FROM patients WHERE zip = 'LONELY' AND left(diagnosis, 9223372036854775807) = 'F'
SELECT COUNT(*) FROM patients WHERE zip = 'LONELY' AND substring(diagnosis, 2, 9223372036854775807) = 'F'
SELECT right(diagnosis, -2147483648) AS k, COUNT(*) FROM patients GROUP BY 1
-- Non-finite and out-of-range constants: identifiers, errors on one engine, analyzer crashes.
SELECT COUNT(*) FROM patients WHERE income < 'Infinity'
SELECT COUNT(*) FROM patients WHERE score > '1e400' OR score = 'NaN'
SELECT COUNT(*) FROM patients WHERE floor(CAST('1e300' AS double precision)) > age
-- A per-person subquery grouped by the unit of the nullable side of a LEFT JOIN.
SELECT SUM(LEAST(t.n, 3)) FROM (SELECT v.patient_id, COUNT(*) n FROM patients p LEFT JOIN visits v ON v.patient_id = p.patient_id GROUP BY v.patient_id) t
-- A constant divisor that is 0 (strpos found nothing) was not guarded.
SELECT b.temperature, VAR_POP(a.temperature), COUNT(120) AS a1 FROM visits a LEFT JOIN public.visits b ON a.patient_id = b.patient_id WHERE 1.5e-3 <= (a.cost / strpos('9%', 'a')) GROUP BY b.temperature
-- A scalar public subquery that found no row was inlined as an untyped NULL: SUM of it was refused (42883) on an empty database only.
SELECT extract(year FROM t.birth) AS k1, smoker, COALESCE(SUM(score), 0) AS n, SUM((SELECT q.population FROM zip_info q WHERE q.state > 'NaN')) AS a0 FROM patients t WHERE t.birth >= t.birth GROUP BY smoker, extract(year FROM t.birth) OFFSET 0 -- params: [1]
-- An outer query over released rows that DuckDB cannot bind ('…' + 1): refused before any charge (was: failed after it).
WITH d AS (SELECT zip, COUNT(*) AS n FROM patients GROUP BY zip) SELECT CAST(ceil((CASE WHEN TRUE THEN -1 ELSE 0 END) / 2.0) AS double precision), COUNT(*) AS a0, SUM(d.n) AS a1, COUNT(d.zip) FROM d WHERE ('2023-01-01T00:00:00Z' + 1) NOT BETWEEN TO_DATE('2023-01-15', 'YYYY-MM-DD') AND '1999-12-31' GROUP BY CAST(ceil((CASE WHEN TRUE THEN -1 ELSE 0 END) / 2.0) AS double precision) HAVING COUNT(DISTINCT coalesce((n * (n % "d"."n")), $1)) < 3 -- params: [-1.25]
-- -0.0 and 0.0 are one GROUP BY key but two texts: PostgreSQL's salted hash counted one person's rows under both as two groups, each bounded (found by the generator, seed 1 #738).
SELECT CASE WHEN smoker THEN -0.0::float8 ELSE 0.0::float8 END AS k, MEDIAN(age), COUNT(*) FROM patients GROUP BY 1
-- numeric 30 and 30.00: one key, two texts on PostgreSQL; the released key was an int or a Decimal by which row came first (seed 7 #478).
SELECT CASE WHEN smoker THEN 30 ELSE 30.00 END AS k, COUNT(*), SUM(age) FROM patients GROUP BY 1
-- Accepted under the small limits, refused under the high ones (22023: SUM(strpos(…) * duration)'s sensitivity at a row ceiling of thousands is past what noise can be calibrated for); the harness took that policy-only refusal for a database-dependent one (seed 1525375103 #78).
SELECT date_trunc('month', visit_date) AS k0, COALESCE(SUM((strpos(b.topic, 'a') * a.duration)), 0), VAR_POP(100) AS a1, mode() WITHIN GROUP (ORDER BY b.topic) AS n FROM public.visits a LEFT JOIN visit_notes b ON a.visit_id = b.visit_id WHERE temperature IS NULL GROUP BY 1
-- A person's MAX of an identifier (summable: false, no bounds) took the bigint type's range into a MEDIAN's histogram, whose grid overflowed in the backend after the charge (seed 1229641267 #23): now refused with 42501, as MEDIAN of the column itself.
SELECT ROUND(MEDIAN(top), 1) AS n, MIN(100.005) FROM (SELECT patient_id, MAX(visit_id) AS top FROM visits GROUP BY patient_id) d LIMIT 3
-- A public subquery with two columns named n, read through * with ORDER BY 1: sqlglot's qualify asserted and the statement crashed (seed 88722124 #37); now refused with 0A000 naming the column.
SELECT * FROM (SELECT z.state, z.zip, COUNT(*) AS n, COALESCE(COUNT(*), 0) AS n FROM zip_info z GROUP BY z.state, 2 ORDER BY 1 ASC, n) AS w ORDER BY 1 DESC LIMIT 3
-- The cache harness's adversarial constants made numeric(4, 1) numeric(2147483647, 7): Decimal(10) ** precision overflowed in the analyzer, an internal error without SQLSTATE (seed 744856841 #24); now refused with 22023 as PostgreSQL does, and a precision above 38 (DuckDB's and Spark's widest) with 0A000.
SELECT MEDIAN(a.cost) AS n, COUNT(-ceil(CAST(duration AS numeric(2147483647, 7)))) AS n FROM "visits" AS a LEFT JOIN "patients" b ON a.patient_id = b.patient_id GROUP BY a.checked_in
SELECT SUM(CAST(duration AS numeric(50, 2))), COUNT(CAST(cost AS numeric(5))) FROM visits
-- CAST(MAX(date) AS int) over released values passed the type inference and failed when the outer query ran over the released rows (seed 352807119 #60, a long run): casts PostgreSQL has no cast for are refused over aggregates (0A000), as in rows.
SELECT w.* FROM (SELECT CAST(MAX("c"."visit_date") AS int) AS n, AVG(cost) FILTER (WHERE smoker), SUM("a"."score")::int4 AS a2 FROM patients a JOIN zip_info b ON a.zip = b.zip LEFT JOIN "visits" AS c ON a.patient_id = c.patient_id WHERE -1 IS NOT DISTINCT FROM $1 AND c.checked_in < (NOW() + INTERVAL '-30 day') HAVING SUM((SELECT MIN(z2.population) FROM zip_info z2)) FILTER (WHERE NOT 'yes' NOT IN ($2, 'é')) <> 3) w WHERE 1 = 1 LIMIT 500 -- params: [2.5, '']
-- ROUND of a released date (percentile_disc of a date) passed the type inference and failed over the released rows (seed 1693497897 #39): round, floor and ceil take numbers (42883).
SELECT * FROM (SELECT extract(year FROM a.visit_date), ROUND(percentile_disc(0.5) WITHIN GROUP (ORDER BY b.visit_date), 1) AS n, SUM(a.cost) FROM public.visits AS a JOIN visits b ON a.patient_id = b.patient_id AND TRUE GROUP BY extract(year FROM a.visit_date)) AS w ORDER BY 1 DESC LIMIT 3
-- A public scalar subquery answering 0 as a divisor was refused (22023) on one database and accepted on another: acceptance depended on public data; its answer is now guarded like a column (NULL), a 0 written in the text still refused (seed 1624253411 #96).
SELECT COUNT((age / (SELECT COUNT(*) FROM zip_info z2 WHERE z2.zip = 'LONELY'))) AS a0, score AS k1, date_trunc('week', checked_in) AS k2, CAST(ceil((CASE WHEN diagnosis NOT IN (' flu ', 'é', '9%') THEN -1 ELSE 0 END) / 2.0) AS double precision) FROM "visits" a JOIN patients AS b ON a.patient_id = b.patient_id WHERE checked_in = TIMESTAMPTZ '2023-02-01 12:00:00+00' GROUP BY CAST(ceil((CASE WHEN diagnosis NOT IN (' flu ', 'é', '9%') THEN -1 ELSE 0 END) / 2.0) AS double precision), 2, date_trunc('week', checked_in) LIMIT 2 -- params: [2]
-- Two COUNT(DISTINCT …) of columns that are not the unit, one in HAVING (seed 1168570002 #29, a long run): the certificate summed the moves of both aggregates' counts against one ℓ, though each is noised on its own at ℓ and the choice of ℓ is calibrated for their number times ℓ; the certificate now checks each against ℓ and their sum against weight·ℓ.
SELECT COUNT(DISTINCT (a.department)) AS a0 FROM visits a JOIN public.patients b ON a.patient_id = b.patient_id HAVING COUNT(DISTINCT b.diagnosis) < 0
-- STDDEV of a per-person SUM: accepted under the small limits, refused under the high ones (0A000, its squares times the row ceiling leave bigint) on every database alike; the harness took the refusal, which depends on the policy and the statement alone, for a data-dependent one (seed 1148091114 #71, a long run).
WITH d AS (SELECT patient_id, COUNT(*) AS n, SUM(income) AS total, AVG(income) AS mean FROM patients GROUP BY patient_id) SELECT d.n, COUNT(*) - STDDEV_POP(total) AS a0, COUNT(d.total) / MEDIAN(total) AS n FROM d GROUP BY d.n ORDER BY d.n DESC, d.n
-- A sum whose values times the high row ceiling leave bigint is refused under the high limits alone (0A000, "too wide to sum exactly"), on every database alike; the harness took it for a data-dependent refusal (seed 2121312072 #30, a long run).
SELECT MEDIAN(b.score) AS n, SUM((strpos("b"."zip", 'a') * extract(dow FROM CAST(TIMESTAMPTZ '2023-02-01 12:00:00+00' AS timestamp)))) AS n FROM public.zip_info a JOIN patients AS b USING (zip) WHERE trim('flu') LIKE '9%'
-- An outer query over released rows whose WHERE overflows in constants only (CAST(32767 AS smallint) + CAST(1 AS smallint)) failed over the released rows, after the charge: DuckDB evaluates it per row, so the dry run over no rows passed. The dry run now also runs over one row of NULLs, and the statement is refused before anything is read (seed 1294838364 #56, a long run).
WITH d AS (SELECT department, COUNT(*) AS n, SUM(cost) AS total, AVG(cost) AS mean, MAX(cost) AS top FROM visits GROUP BY department) SELECT AVG(d.top) AS n, COUNT(greatest(length('é'), (CASE WHEN FALSE THEN d.n ELSE d.mean END - d.mean))) AS a1 FROM d WHERE replace(CAST('2023-03-01 00:00:00+02' AS varchar(3)), 'a', 'b') <> concat('-0', CAST(32767 AS smallint) + CAST(1 AS smallint))
-- Shapes real tools send, accepted in the sixteenth session (Ibis's .date(), .day_of_week.index(), .substr(), .startswith, .strftime; psycopg's ANY list and a date_trunc unit as a parameter; Grafana's $__timeGroup under $__timeFilter; a share over a window): every backend, certificates and all.
SELECT date(seen) AS d, COUNT(*) FROM patients GROUP BY 1
SELECT CAST(EXTRACT('dow' FROM seen) + 6 AS SMALLINT) % 7 AS d, COUNT(*) FROM patients GROUP BY 1
SELECT SUBSTRING(zip FROM CASE WHEN (0 + 1) >= 1 THEN 0 + 1 ELSE 0 + 1 + LENGTH(zip) END FOR 2) AS p, COUNT(*) FROM patients GROUP BY 1
SELECT COUNT(*), SUM(age) FROM patients WHERE STARTS_WITH(zip, '1')
SELECT to_char(seen, 'YYYY-MM') AS m, COUNT(*) FROM patients GROUP BY 1
SELECT to_char(birth, 'YYYY-MM-DD HH24:MI') AS d, COUNT(*) FROM patients GROUP BY 1
SELECT floor(extract(epoch from seen)/3600)*3600 AS time, COUNT(*) FROM patients WHERE seen BETWEEN '2020-01-01T00:00:00Z' AND '2020-01-02T00:00:00Z' GROUP BY 1 ORDER BY 1
SELECT diagnosis, COUNT(*) FROM patients WHERE diagnosis = ANY(ARRAY['flu', 'cold']) GROUP BY 1
SELECT COUNT(*) FROM patients WHERE age = ANY($1) -- params: [[30, 40]]
SELECT date_trunc($1, seen) AS m, COUNT(*) FROM patients GROUP BY 1 -- params: ['year']
SELECT department, COUNT(*) * 100 / SUM(COUNT(*)) OVER () AS pct FROM visits GROUP BY 1
-- round() of a constant with its digits replaced by adversarial constants (the cache check): PostgreSQL clamps the digits, and the engine's decimal context had 28 digits (a long run, seventeenth session).
SELECT COUNT(*)::int4 AS n, COUNT(a.age) AS n, COUNT(a.age) AS a0 FROM patients a LEFT OUTER JOIN zip_info b ON a.zip = b.zip ORDER BY CAST(round(100, 0) AS int)
SELECT COUNT(*), round(123456789012345678901234567890.5, 5), CAST(99.94 AS numeric(3,1)) FROM patients
-- Past the limit on the nodes of MIN/MAX/MEDIAN/percentile/MODE aggregates (three MINs of a CASE, two of them in dp_interval columns): 54001, documented; the harness's list lacked it (a long run, seventeenth session).
SELECT MIN(CASE WHEN NOT b.zip IN (SELECT q.zip FROM zip_info AS q WHERE q.population = b.patient_id) THEN b.income ELSE (income + CAST(32767 AS SMALLINT) + CAST(1 AS SMALLINT)) END) FILTER(WHERE b.birth >= (CURRENT_DATE + 7) AND b.birth < CAST(CURRENT_TIMESTAMP AS DATE)) * 1.5, POWER(COUNT((c.duration + c.temperature)), 2), DP_INTERVAL_LOW(ROUND(MIN(CASE WHEN NOT b.zip IN (SELECT q.zip FROM zip_info AS q WHERE q.population = b.patient_id) THEN b.income ELSE (income + CAST(32767 AS SMALLINT) + CAST(1 AS SMALLINT)) END), 1)), DP_INTERVAL_HIGH(ROUND(MIN(CASE WHEN NOT b.zip IN (SELECT q.zip FROM zip_info AS q WHERE q.population = b.patient_id) THEN b.income ELSE (income + CAST(32767 AS SMALLINT) + CAST(1 AS SMALLINT)) END), 1)) FROM "zip_info" AS a LEFT JOIN public.patients AS b ON a.population = b.age LEFT JOIN public.visits AS c USING (patient_id) GROUP BY c.temperature ORDER BY POWER(COUNT((c.duration + c.temperature)), 2) ASC, MIN(CASE WHEN NOT b.zip IN (SELECT q.zip FROM zip_info AS q WHERE q.population = b.patient_id) THEN b.income ELSE (income + CAST(32767 AS SMALLINT) + CAST(1 AS SMALLINT)) END) FILTER(WHERE b.birth >= (CURRENT_DATE + 7) AND b.birth < CAST(CURRENT_TIMESTAMP AS DATE)) * 1.5 DESC LIMIT 1.5 -- params: [2]
-- floor, ceil and sign of an integer are double precision in PostgreSQL (so round(floor(x), 0) does not exist there); they were typed numeric and int4, accepted, and failed on PostgreSQL (a long run, seventeenth session).
SELECT t.answer, ROUND(COUNT(length(CASE WHEN t.answer = ANY(ARRAY['9%', $1, 'yes']) THEN t.answer ELSE 'CA' END)), 0) AS a0, SUM(round(round(floor(t.rating), 0), 2)) * 2 AS a1, COUNT(*) + (SELECT MIN(q.population) FROM zip_info q WHERE q.zip <> 'é') AS a2 FROM survey t GROUP BY 1 HAVING (STDDEV(rating) > 1 AND AVG(t.rating) < 100) -- params: ['er']
SELECT SUM(round(floor(rating), 0)) FROM survey
SELECT floor(rating) AS f, sign(rating - 3) AS s, ceil(rating / 2) AS c, COUNT(*) FROM survey GROUP BY 1, 2, 3
-- A window that reads no key or aggregate of its SELECT (the number of groups): the aggregate had no column, and the analysis crashed (a long run, eighteenth session).
SELECT COUNT(*) OVER () FROM patients a LEFT JOIN visits b ON a.patient_id = b.patient_id WHERE a.birth = ANY(ARRAY[TO_DATE('2023-01-15', 'YYYY-MM-DD')]) GROUP BY a.birth
SELECT ROW_NUMBER() OVER () AS n, COUNT(*) OVER () AS groups FROM survey GROUP BY answer ORDER BY 1
-- A window's count divided by a noisy COUNT released as 0, over released rows: DuckDB divided the integers in double precision to an infinity it could not cast back (a long run, eighteenth session); NULL, as a division by zero over released values is.
SELECT AVG(a.temperature), COUNT(*) OVER () / COUNT(NULL) AS n, COUNT(*) OVER () FROM visits AS a INNER JOIN public.patients AS b ON a.patient_id = b.patient_id AND TRUE WHERE seen < (CURRENT_DATE - INTERVAL '1 YEAR') ORDER BY 2 DESC NULLS LAST, COUNT(score) OFFSET $1 -- params: [1]
-- AVG of the constant -2^63: its bounds on the release's grid pass int64, and the columnar release failed after the charge (a long run, eighteenth session).
SELECT TO_CHAR(checked_in, 'YYYY'), AVG((-9223372036854775807 - 1)) AS n, COUNT(*), COUNT(*) OVER (PARTITION BY TO_CHAR(checked_in, 'YYYY')) FROM visits AS v WHERE checked_in > CURRENT_TIMESTAMP GROUP BY TO_CHAR(checked_in, 'YYYY') LIMIT NULL -- params: [2]
SELECT AVG((-9223372036854775807 - 1)) AS n, COUNT(*) FROM visits
