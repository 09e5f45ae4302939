from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.CreateModel(
            name="Counter",
            fields=[
                ("id", models.IntegerField(primary_key=True, serialize=False)),
                ("n", models.BigIntegerField(default=0)),
            ],
            options={"db_table": "bench_counter"},
        ),
    ]
