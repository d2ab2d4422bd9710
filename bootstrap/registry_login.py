"""Private images (issue 68), two ways:
- the task's `registry_auth`: a login the user names, its password read from the caller's
  environment and sent on the pull's stdin (`user_login`);
- else the node's own credentials, and where a pull is denied and the image is in ECR, Artifact
  Registry (or Container Registry) or ACR, the node logs in the cloud's documented way as what
  it is (the instance role, the service account's metadata token, the managed identity) and
  pulls again (`identity_login`): never a secret from the controller, and nothing changes for a
  public image or a node already logged in (the first pull is the runtime's own).

The login goes into a directory of its own that the pull uses and that is removed right after
(podman's ``--authfile``, docker's ``--config``): the node's own login files are never written,
and the token rests nowhere. It is a shell variable until then: never on a command line.

Sources (checked 2026-11-30): ECR, "Private registry authentication" (`aws ecr
get-login-password | docker login --username AWS --password-stdin <account>.dkr.ecr.<region>
.amazonaws.com`); Artifact Registry, "Configure authentication to Artifact Registry for Docker",
access token (`oauth2accesstoken` and the metadata server's token); ACR, "Azure Container
Registry integration with Azure Active Directory" (azure.github.io/acr/AAD-OAuth.html: the
managed identity's token exchanged at ``/oauth2/exchange`` for a refresh token, user
``00000000-0000-0000-0000-000000000000``)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from sortie.core.image_ref import ImageRef, RegistryAuth

_JSON_FIELD = "python3 -c 'import json,sys; print(json.load(sys.stdin)[\"{}\"])'"
_GCP_TOKEN = ("curl -sf -H 'Metadata-Flavor: Google' http://metadata.google.internal/"
              "computeMetadata/v1/instance/service-accounts/default/token | "
              + _JSON_FIELD.format("access_token"))
_AZURE_TOKEN = ("curl -sf -H Metadata:true 'http://169.254.169.254/metadata/identity/oauth2/token"
                "?api-version=2018-02-01&resource=https%3A%2F%2Fmanagement.azure.com%2F' | "
                + _JSON_FIELD.format("access_token"))
# What a denied pull says, per runtime (podman, docker), as `_why_pull_failed` reads it.
DENIED = ("*nauthorized*", "*denied*", '*"uthentication required"*', "*orbidden*")


@dataclass(frozen=True)
class RegistryLogin:
    """How a node logs in to a registry: as itself, to a cloud's (`identity_login`), or as the
    user's `registry_auth` says (`user_login`)."""

    registry: str  # the host, as the image names it
    way: str  # in words, for the one line a failure says
    username: str
    password: str  # shell printing the token on stdout
    stdin: str = field(default="", repr=False)  # the pull's stdin (the user's password)


def registry_host(image: ImageRef) -> str | None:
    """The registry an image names (its first part when that is a host), else None: Docker Hub."""
    first, _, rest = image.name.partition("/")
    return first if rest and ("." in first or ":" in first or first == "localhost") else None


def identity_login(image: ImageRef) -> RegistryLogin | None:
    """The cloud's way to log in to ``image``'s registry as the node; None for any other
    registry (a public one, a site's own: the node's own login stands)."""
    host = registry_host(image)
    if host is None:
        return None
    if found := re.fullmatch(r"\d{12}\.dkr\.ecr(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?",
                             host):
        return RegistryLogin(host, "as the node (ECR, the instance role)", "AWS",
                             f"aws ecr get-login-password --region {found.group(1)}")
    if re.fullmatch(r"[a-z0-9-]+-docker\.pkg\.dev|(?:[a-z]+\.)?gcr\.io", host):
        return RegistryLogin(host, "as the node (Artifact Registry, the service account's "
                             "metadata token)",
                             "oauth2accesstoken", _GCP_TOKEN)
    if re.fullmatch(r"[a-z0-9]{5,50}\.azurecr\.(?:io|cn|us)", host):
        exchange = (f"printf 'grant_type=access_token&service={host}&access_token=%s' \"$aad\" | "
                    f"curl -sf --data @- https://{host}/oauth2/exchange | "
                    + _JSON_FIELD.format("refresh_token"))
        return RegistryLogin(host, "as the node (ACR, the managed identity)",
                             "00000000-0000-0000-0000-000000000000",
                             f"aad=$({_AZURE_TOKEN}) && {exchange}")
    return None


def user_login(image: ImageRef, auth: RegistryAuth, password: str) -> RegistryLogin:
    """The user's own login to ``image``'s registry (`registry_auth:`), its password read from
    the pull's stdin (`PASSWORD_FROM_STDIN`, the script's first line)."""
    return RegistryLogin(registry_host(image) or "docker.io",
                         f"as {auth.username} with ${auth.password}", auth.username,
                         'printf %s "$user_pw"', password)


PASSWORD_FROM_STDIN = 'user_pw=$(cat)\n'  # first: the sender's channel is never cut under it


def login_pull_line(login: RegistryLogin, ref: str, log: str) -> str:
    """Shell: log in as ``login`` says into a directory of its own, pull ``ref`` with it (its
    progress appended to ``log``, which the controller follows) and remove the directory; where
    that fails, exit 4 after a line ``sortie: ...`` saying how it logged in and what the runtime
    said last (`_why_pull_failed` says it). ``$rt``: the runtime; ``$out``: the output of a pull
    before, said where the password cannot be had."""
    host, ref, log = shlex.quote(login.registry), shlex.quote(ref), shlex.quote(log)
    denied = shlex.quote(f"sortie: denied, logged in {login.way}: ")
    failed = shlex.quote(f"sortie: logging in to {login.registry} {login.way} failed")
    return (
        'af=$(mktemp -d) || exit 1\n'
        'case "$rt" in *podman) cfg=; auth="--authfile $af/auth.json" ;; '
        '*) cfg="--config $af"; auth= ;; esac\n'
        f'if pw=$({login.password}) && [ -n "$pw" ]; then\n'
        f'  out=$(printf %s "$pw" | "$rt" $cfg login $auth -u {shlex.quote(login.username)} '
        f'--password-stdin {host} 2>&1 > /dev/null) && {{ "$rt" $cfg pull $auth {ref} >> {log} '
        f'2>&1 < /dev/null || {{ out=$(tail -n 1 {log}); false; }}; }} '
        f'|| {{ rm -rf "$af"; echo {denied}"$(echo "$out" | tail -n 1)"; exit 4; }}\n'
        f'else rm -rf "$af"; echo "$out"; echo {failed}; exit 4; fi\n'
        'rm -rf "$af"\n')


def retry_line(login: RegistryLogin, ref: str, log: str) -> str:
    """Shell run after a pull of ``ref`` failed with ``$out``: unless the registry denied it,
    ``$out`` and exit 4; else logged in as the node, again (`login_pull_line`)."""
    return (f'case "$out" in {"|".join(DENIED)}) ;; *) echo "$out"; exit 4 ;; esac\n' +
            login_pull_line(login, ref, log))
