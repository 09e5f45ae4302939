from django.apps import AppConfig


class MeetingsConfig(AppConfig):
    name = "sampleproject.meetings"
    label = "meetings"
    verbose_name = "Meetings"

    def ready(self) -> None:
        # Connects the receivers that keep each meeting's and room request's jobs in step.
        from sampleproject.meetings import signals  # noqa: F401
