"""Superset configuration for scripts/bi_tools/run.sh: a throwaway metadata database in
$SUPERSET_HOME, no CSRF on the REST API (the driver logs in with a JWT), no example data."""

import os

SECRET_KEY = "dpproxy-bi-tools-throwaway-key"
SQLALCHEMY_DATABASE_URI = "sqlite:///" + os.path.join(os.environ["SUPERSET_HOME"], "superset.db")
WTF_CSRF_ENABLED = False
TALISMAN_ENABLED = False
FEATURE_FLAGS = {"ENABLE_TEMPLATE_PROCESSING": False}
SQLLAB_ASYNC_TIME_LIMIT_SEC = 60
