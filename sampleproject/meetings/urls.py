from django.urls import path

from sampleproject.meetings import views

app_name = "meetings"

urlpatterns = [
    path("", views.meeting_list, name="list"),
    path("create/", views.meeting_create, name="create"),
    path("<int:pk>/move/", views.meeting_move, name="move"),
    path("room-requests/", views.room_request_list, name="request_list"),
    path("room-requests/create/", views.room_request_create, name="request_create"),
    path("room-requests/<int:pk>/approve/", views.room_request_approve, name="request_approve"),
]
