from django.contrib import admin

from delayjobs.admin import DelayedJobInline
from sampleproject.meetings.models import Attendee, Meeting, Reminder, Room


@admin.register(Room)
class RoomAdmin(admin.ModelAdmin):
    list_display = ["name"]
    search_fields = ["name"]


class AttendeeInline(admin.TabularInline):
    model = Attendee
    extra = 1


@admin.register(Meeting)
class MeetingAdmin(admin.ModelAdmin):
    list_display = ["title", "room", "starts_at", "ends_at", "remind_minutes", "status"]
    list_filter = ["status", "room"]
    search_fields = ["title"]
    date_hierarchy = "starts_at"
    # The meeting's reminder, start and end jobs, with their status and history links.
    inlines = [AttendeeInline, DelayedJobInline]


@admin.register(Attendee)
class AttendeeAdmin(admin.ModelAdmin):
    list_display = ["name", "email", "meeting"]
    list_filter = ["meeting__room"]
    search_fields = ["name", "email", "meeting__title"]


@admin.register(Reminder)
class ReminderAdmin(admin.ModelAdmin):
    list_display = ["meeting", "attendee", "meeting_starts_at", "sent_at"]
    list_filter = ["meeting__room"]
    search_fields = ["meeting__title", "attendee__email"]
