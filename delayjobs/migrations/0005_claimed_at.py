"""The claim and the execution start become two times (the claim precedes run_at by up
to CLAIM_AHEAD). The old ``started_at`` was the claim: it is renamed, not copied, so
every running job's fence keeps holding across the upgrade."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("delayjobs", "0004_jobs_skip_expiry_priority_result_api_keys"),
    ]

    operations = [
        migrations.RenameField(
            model_name="delayedjob",
            old_name="started_at",
            new_name="claimed_at",
        ),
        migrations.AlterField(
            model_name="delayedjob",
            name="claimed_at",
            field=models.DateTimeField(
                blank=True,
                help_text="When a consumer claimed the current or latest run.",
                null=True,
                verbose_name="claimed at",
            ),
        ),
        migrations.AddField(
            model_name="delayedjob",
            name="started_at",
            field=models.DateTimeField(
                blank=True,
                help_text="When the latest attempt began to execute (written with its outcome).",
                null=True,
                verbose_name="started at",
            ),
        ),
        migrations.AlterField(
            model_name="jobattempt",
            name="started_at",
            field=models.DateTimeField(
                help_text="When this attempt began to execute.", verbose_name="started at"
            ),
        ),
    ]
