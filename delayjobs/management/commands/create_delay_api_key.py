"""Create an API key for the HTTP API (delayjobs.http) and print it, once."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from delayjobs.api_keys import create_api_key


class Command(BaseCommand):
    help = (
        "Create an API key for the delayjobs HTTP API, acting as --user with that user's "
        "permissions. The key is printed on stdout, alone, and never shown again."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--user", required=True, help="The username the key acts as.")
        parser.add_argument("--name", required=True, help="Who uses the key, for what.")
        parser.add_argument(
            "--job-type",
            action="append",
            dest="job_types",
            default=[],
            metavar="NAME",
            help="A private job type the key may schedule besides the public ones; repeat "
            "for several.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        username, name = options["user"], options["name"]
        user_model = get_user_model()
        try:
            user = user_model._default_manager.get_by_natural_key(username)
        except user_model.DoesNotExist:
            raise CommandError(f"No user {username!r}: create the user first.") from None
        if not user.is_active:
            raise CommandError(f"User {username!r} is inactive: the API would refuse its keys.")
        try:
            key, plaintext = create_api_key(user, name, options["job_types"])
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        # The key alone on stdout, so that KEY=$(manage.py create_delay_api_key ...) works.
        self.stdout.write(plaintext)
        self.stderr.write(
            f"Created API key {key.name!r} (prefix {key.prefix}) for {username}. "
            f"It is shown only this once: store it now."
        )
