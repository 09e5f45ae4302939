from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tests", "0002_binding_models"),
    ]

    operations = [
        migrations.CreateModel(
            name="RoomAppointment",
            fields=[
                (
                    "appointment_ptr",
                    models.OneToOneField(
                        auto_created=True,
                        on_delete=models.deletion.CASCADE,
                        parent_link=True,
                        primary_key=True,
                        serialize=False,
                        to="tests.appointment",
                    ),
                ),
                ("room", models.CharField(blank=True, default="", max_length=50)),
            ],
            bases=("tests.appointment",),
        ),
    ]
