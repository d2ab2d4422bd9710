"""A container image's name as a user writes it (`image:` in a task, `--image`), checked before
it reaches a node's shell: ``[registry[:port]/]path[:tag][@sha256:<digest>]``, the grammar of
the OCI distribution spec's references (docker's `reference` package), lowercase path parts;
and what a run recorded of the image it ran in (`ImageUse`, in `run.json`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sortie.core.userfile import ENV_NAME

_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_REF = re.compile(
    rf"^(?P<name>(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]{{1,5}})?/)?"
    rf"{_PART}(?:/{_PART})*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(?:@(?P<digest>sha256:[a-f0-9]{64}))?$")
MAX_IMAGE_REF = 512
IMAGE_RULE = "[registry/]name[:tag][@sha256:digest], e.g. nvcr.io/nvidia/pytorch:24.05-py3"


@dataclass(frozen=True)
class ImageRef:
    """An image reference, parsed."""

    name: str  # the repository: registry and path, no tag
    tag: str | None = None
    digest: str | None = None  # sha256:...

    @classmethod
    def parse(cls, text: str) -> ImageRef:
        """ValueError naming the rule when ``text`` is no image reference."""
        found = IMAGE_REF.fullmatch(text) if len(text) <= MAX_IMAGE_REF else None
        if not found:
            raise ValueError(f"{text[:80]!r} is not an image reference ({IMAGE_RULE})")
        first, _, rest = found["name"].partition("/")
        if rest and not _is_registry(first) and not re.fullmatch(_PART, first):
            # `MyOrg/train`: docker would take MyOrg for a registry's host and fail to reach
            # it, podman refuses the name: either way only after the cluster is up.
            raise ValueError(f"{text[:80]!r} is not an image reference: a repository's name is "
                             f"lowercase ({first.lower()}/{rest}), and a registry's host has a "
                             "dot or a port (localhost aside)")
        return cls(found["name"], found["tag"], found["digest"])

    @property
    def pinned(self) -> bool:
        return self.digest is not None

    def at(self, digest: str) -> ImageRef:
        """This repository at ``digest``: what every node runs once a tag is resolved."""
        return ImageRef(self.name, None, digest)

    def same_repository(self, name: str) -> bool:
        """Whether ``name`` (a runtime's, which spells Docker Hub's in full) is this one's."""
        def short(text: str) -> str:
            return text.removeprefix("docker.io/").removeprefix("library/")
        return short(name) == short(self.name)

    def __str__(self) -> str:
        return self.name + (f":{self.tag}" if self.tag else "") + \
            (f"@{self.digest}" if self.digest else "")


def _is_registry(first: str) -> bool:
    """Whether a reference's first part names a registry's host, by docker's rule."""
    return "." in first or ":" in first or first == "localhost"


def image_ref(text: str | None) -> str | None:
    """A field validator's check: ``text`` as given, or ValueError."""
    if text is not None:
        ImageRef.parse(text)
    return text


class ImageUse(BaseModel):
    """What `run.json` says of the image a run ran in."""

    asked: str  # as the task or flag named it
    image: str  # by digest, as every node ran it
    runtime: str
    size_bytes: int
    # Each node's pull in seconds (where it had the image: its check of it).
    pulled_s: dict[str, float] = Field(default_factory=dict)
    setup_image: str | None = None  # the image the setup made, which the job ran in


class RegistryAuth(BaseModel):
    """`registry_auth:` in a task: the login a private image's registry takes, the password by
    the name of a variable of the caller's environment (an NGC API key: `username:
    $oauthtoken`), never its value: that is read at launch, sent to each node on stdin for its
    pull and kept nowhere (`bootstrap/registry_login.py`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    username: str = Field(min_length=1, max_length=256, pattern=r"^[!-~]+$")  # no blanks
    password: str = Field(max_length=128)  # a variable's name

    @field_validator("password")
    @classmethod
    def _a_name(cls, name: str) -> str:
        if not ENV_NAME.fullmatch(name):
            # Not echoed: a password written here by mistake stays out of the error.
            raise ValueError("not a variable's name: give the name of a variable of your "
                             "environment that holds the password, never the password itself")
        return name
