"""Post-processing: expressions over released (already noisy) values, with PostgreSQL semantics.

Projections, HAVING, ORDER BY and arithmetic over aggregates run here, in Python, on values that
have already been noised: post-processing cannot weaken differential privacy. This module never
sees a true aggregate or a row of a protected table; it only reads the placeholders the analyzer
put in place of aggregates and group keys.

Division by zero yields NULL instead of an error: the query has been paid for by then, and an
error would throw the released values away.

Split into `inference` (types of expressions), `values` (PostgreSQL semantics of values) and
`compiler` (expressions compiled to closures over a released row).
"""

from dpproxy.sql.postprocess.compiler import compile_expression, evaluate
from dpproxy.sql.postprocess.inference import Env, TypeEnv, check_comparisons, infer_type, literal_type
from dpproxy.sql.postprocess.values import convert, to_text

__all__ = [
    "Env",
    "TypeEnv",
    "check_comparisons",
    "compile_expression",
    "convert",
    "evaluate",
    "infer_type",
    "literal_type",
    "to_text",
]
