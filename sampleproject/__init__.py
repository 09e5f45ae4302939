"""A sample project using delayjobs: meetings (reminders, start, end, room requests), orders."""
