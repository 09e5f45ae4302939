from django.apps import AppConfig


class MeetingsConfig(AppConfig):
    name = "sampleproject.meetings"
    label = "meetings"
    verbose_name = "Meetings"
