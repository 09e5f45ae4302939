"""The index of the limited claim's count of a key's running jobs, built without locking
the job table against writes on PostgreSQL: the previous release's consumers keep claiming
and recording meanwhile (docs/howto/development.md, "Migrations")."""

from django.db import migrations, models
from django.db.migrations.operations import AddIndex


class AddIndexConcurrentlyOnPostgreSQL(AddIndex):
    """``CREATE INDEX CONCURRENTLY`` on PostgreSQL, as Django's ``AddIndexConcurrently``
    does (not imported: django.contrib.postgres needs psycopg, which a project on SQLite
    may not have); a plain ``AddIndex`` elsewhere (SQLite has no concurrent build, and
    locks the whole database for any write anyway)."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor != "postgresql":
            return super().database_forwards(app_label, schema_editor, from_state, to_state)
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.add_index(model, self.index, concurrently=True)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor != "postgresql":
            return super().database_backwards(app_label, schema_editor, from_state, to_state)
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.remove_index(model, self.index, concurrently=True)


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("delayjobs", "0002_limits"),
    ]

    operations = [
        AddIndexConcurrentlyOnPostgreSQL(
            model_name="delayedjob",
            index=models.Index(
                condition=models.Q(("limit_key__isnull", False)),
                fields=["limit_key", "status"],
                name="delayjobs_limit_key",
            ),
        ),
    ]
