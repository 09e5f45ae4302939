# A nullable column with no default: consumers of the previous release, which neither
# read nor write it, keep running while it is added (their INSERTs leave it NULL).

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("delayjobs", "0003_limit_key_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="delayedjob",
            name="trace_context",
            field=models.JSONField(
                blank=True,
                help_text="The W3C trace context of the span that scheduled the job.",
                null=True,
                verbose_name="trace context",
            ),
        ),
    ]
