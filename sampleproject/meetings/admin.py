from django.contrib import admin

from delayjobs.admin import DelayedJobInline
from sampleproject.meetings.models import Attendee, Meeting, Reminder, Room, RoomRequest


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


@admin.register(RoomRequest)
class RoomRequestAdmin(admin.ModelAdmin):
    list_display = [
        "room",
        "requested_by",
        "starts_at",
        "ends_at",
        "status",
        "expires_at",
        "decided_at",
    ]
    list_filter = ["status", "room"]
    search_fields = ["requested_by"]
    actions = ["approve"]

    @admin.action(description="Approve selected pending requests")
    def approve(self, request, queryset) -> None:
        approved = sum(room_request.approve() for room_request in queryset)
        self.message_user(request, f"{approved} request(s) approved.")
