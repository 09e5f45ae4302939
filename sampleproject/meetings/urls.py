from django.urls import path

from sampleproject.meetings import views

app_name = "meetings"

urlpatterns = [
    path("", views.meeting_list, name="list"),
    path("create/", views.meeting_create, name="create"),
    path("<int:pk>/move/", views.meeting_move, name="move"),
]
