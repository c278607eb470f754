"""Credentials, replaced by ``***`` before a setting or a URL is logged or written anywhere.

Run logs, MLflow parameters and INFO log lines are read by more people than the job's own
settings, and the URLs a job is given often carry a credential: ``user:password@`` (``s3://KEY:SECRET@bucket``,
``https://user:pw@mlflow-host``), a query parameter (presigned URLs, SAS tokens, ``?password=``), or a
Spark Connect parameter (``sc://host:15002/;token=...``). Settings given as mappings carry them under
a name instead: fsspec's and boto's storage options (``key``, ``secret``, ``token``,
``aws_secret_access_key``, ``client_kwargs: {aws_session_token: ...}``, ``account_key``,
``connection_string``), so a mapping's value is hidden whatever it is when its key names a credential.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["is_secret_name", "redact"]

# user:password@ in any URL; a '/' is allowed before the '@' because cloud secret keys contain it
# unencoded (a path with an '@' in it is redacted too: better a log shows too little than a key)
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)[^@?#\s]*@")
# credentials passed as query parameters: any parameter whose name contains one of these words
# (access_token, X-Goog-Signature, X-Amz-Security-Token, client_secret, Authorization)
_SECRET_QUERY = re.compile(
    r"(?i)(?P<key>[?&;][\w.\-]*?(?:passw(?:or)?d|pwd|secret|token|signature|sig|"
    r"credential|api[_\-]?key|access[_\-]?key|sas|authori[sz]ation)[\w.\-]*=)[^&;#\s'\"]*"
)
# A Spark Connect URL's ';name=value' parameters: those the client does not know itself are sent to the
# server as gRPC headers, where credentials travel (an authorization header, a vendor's key), so every
# value is hidden except the client's own settings that are no secret.
_CONNECT_URL = re.compile(r"(?i)\bsc://[^\s'\"]*")
_CONNECT_PARAM = re.compile(r";(?P<name>[^;=\s'\"]*)=(?P<value>[^;\s'\"]*)")
_CONNECT_PUBLIC = frozenset({"use_ssl", "user_id", "user_agent", "session_id", "grpc_max_message_size"})


# A mapping key that names a credential, matched on its snake_case form (camelCase keys such as boto's
# SecretAccessKey are split first): a word anywhere in it (client_secret, aws_secret_access_key, password,
# credentials, authorization, api_key, connection_string: Azure's holds the AccountKey), or a name that
# ends in key or token (key, account_key, aws_access_key_id, token, sas_token, aws_session_token). A
# name that only mentions a token is no secret: pad_token_id, tokens_per_s, tokenizer.
_SECRET_NAME = re.compile(
    r"(?:^|_)(?:secrets?|passw(?:or)?d|pwd|passphrase|credentials?|authori[sz]ation|api_?key|"
    r"connection_string|signature)(?:_|$)|(?:^|_)key(?:_id)?$|(?:^|_)token$|^auth$"
)
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
HIDDEN = "***"


def is_secret_name(name: object) -> bool:
    """Whether a mapping key (a setting's or a storage option's name) names a credential."""
    if not isinstance(name, str):
        return False
    return bool(_SECRET_NAME.search(_CAMEL.sub("_", name).lower().replace("-", "_").replace(".", "_")))


def _connect(match: re.Match[str]) -> str:
    return _CONNECT_PARAM.sub(
        lambda p: p.group(0) if p.group("name").lower() in _CONNECT_PUBLIC else f";{p.group('name')}=***",
        match.group(0),
    )


def redact(value: Any) -> Any:
    """``value`` with the credentials in any URL it holds replaced by ``***`` (strings inside
    mappings, lists and tuples too), and every value of a mapping whose key names a credential
    (:func:`is_secret_name`), at any depth, replaced by ``***`` (None stays None: nothing was given)."""
    if isinstance(value, str):
        value = _CONNECT_URL.sub(_connect, value)
        return _SECRET_QUERY.sub(r"\g<key>***", _USERINFO.sub(r"\g<scheme>***@", value))
    if isinstance(value, Mapping):
        return {k: HIDDEN if v is not None and is_secret_name(k) else redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact(v) for v in value)
    return value
