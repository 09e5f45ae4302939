"""How the driver tells ``benchmarks.settings`` (in itself and in consumers) where the
servers are. Standard library only and nothing else imported: the settings module imports
this in every consumer process, which must load no more than a production consumer does.
"""

DATABASE_ENV = "DELAYJOBS_BENCH_DATABASE"
REDIS_URL_ENV = "DELAYJOBS_BENCH_REDIS_URL"
CONN_MAX_AGE_ENV = "DELAYJOBS_BENCH_CONN_MAX_AGE"
#: The job body every system's benchmark job runs after recording its start
#: (``benchmarks.bodies``): set by the driver, inherited by every consumer process.
BODY_ENV = "DELAYJOBS_BENCH_BODY"
#: ``host:port`` of the local HTTP server the ``http`` body calls (``benchmarks.http_server``).
HTTP_ADDRESS_ENV = "DELAYJOBS_BENCH_HTTP_ADDRESS"
#: The Django app of the peer ``benchmarks.tasks_settings`` configures (dj_queue or
#: django_tasks_db), and its ``TASKS`` options as JSON.
TASKS_APP_ENV = "DELAYJOBS_BENCH_TASKS_APP"
TASKS_OPTIONS_ENV = "DELAYJOBS_BENCH_TASKS_OPTIONS"
