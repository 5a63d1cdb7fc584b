"""The files management commands read and write (``runners.files``), with
bad paths and bad JSON as one-line command errors. (A leading underscore:
Django takes every other module here for a command.)"""

from __future__ import annotations

import functools

from django.core.management.base import CommandError

from runners import files


def _command_error(call):
    @functools.wraps(call)
    def checked(*args, **kwargs):
        try:
            return call(*args, **kwargs)
        except files.FileProblem as exc:
            raise CommandError(str(exc)) from None

    return checked


read_json = _command_error(files.read_json)


class OutputFile(files.OutputFile):
    __init__ = _command_error(files.OutputFile.__init__)
    write = _command_error(files.OutputFile.write)
