"""Where the embedded SQLite database lives by default: the user's data directory.

Never the temporary directory: a memory store is meant to survive a reboot, and on many
systems ``/tmp`` is cleared at boot and readable by other users.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path, PurePath, PureWindowsPath

from tiermem.errors import ValidationError

__all__ = [
    "APP_DIR_NAME",
    "DATABASE_FILE_NAME",
    "data_dir_for",
    "default_data_dir",
    "default_database_path",
]

APP_DIR_NAME = "tiermem"
DATABASE_FILE_NAME = "tiermem.db"


def data_dir_for(platform: str, environ: Mapping[str, str], home: PurePath) -> PurePath:
    """The per-user data directory of tiermem on ``platform`` (a ``sys.platform`` value).

    * Linux and other Unixes: ``$XDG_DATA_HOME/tiermem``, else ``~/.local/share/tiermem``
      (a relative ``XDG_DATA_HOME`` is ignored, as the XDG spec requires);
    * macOS: ``~/Library/Application Support/tiermem``;
    * Windows: ``%LOCALAPPDATA%\\tiermem``, else ``~\\AppData\\Local\\tiermem``.

    Pure: reads nothing but its arguments and creates nothing.
    """
    base: PurePath
    if platform == "win32":
        local = environ.get("LOCALAPPDATA", "")
        # Windows paths stay Windows paths even when this runs elsewhere (in tests).
        base = PureWindowsPath(local) if local else PureWindowsPath(home) / "AppData" / "Local"
    elif platform == "darwin":
        base = home / "Library" / "Application Support"
    else:
        xdg = environ.get("XDG_DATA_HOME", "")
        base = PurePath(xdg) if xdg and PurePath(xdg).is_absolute() else home / ".local" / "share"
    return base / APP_DIR_NAME


def default_data_dir() -> Path:
    """The per-user data directory of tiermem (see :func:`data_dir_for`), created if missing.

    Raises:
        ValidationError: the home directory cannot be determined; pass a path explicitly.
        OSError: the directory cannot be created.
    """
    try:
        home = Path.home()
    except RuntimeError as exc:
        raise ValidationError(
            "cannot find the home directory to put the tiermem database in; set HOME "
            "(or XDG_DATA_HOME), or pass the database path explicitly"
        ) from exc
    directory = Path(data_dir_for(sys.platform, os.environ, home))
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def default_database_path() -> Path:
    """``default_data_dir() / "tiermem.db"``: the file the embedded default uses."""
    return default_data_dir() / DATABASE_FILE_NAME
