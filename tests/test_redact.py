"""Credentials in URLs are hidden before anything logs or writes them (sparkdp.redact)."""

from __future__ import annotations

import pytest

from sparkdp.redact import redact

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize(
    "url, shown",
    [
        ("sc://host:15002/;token=t0k3n", "sc://host:15002/;token=***"),
        (
            "sc://host:15002/;use_ssl=true;token=t0k3n;user_id=alice",
            "sc://host:15002/;use_ssl=true;token=***;user_id=alice",
        ),
        # parameters the Connect client does not know travel as gRPC headers: hidden, whatever their name
        (
            "sc://h:443/;x-custom-auth=Zm9vOmJhcg==;session_id=5f1d",
            "sc://h:443/;x-custom-auth=***;session_id=5f1d",
        ),
        ("sc://h/;authorization=Bearer%20abc", "sc://h/;authorization=***"),
        ("connecting to 'sc://h:1/;token=abc' failed", "connecting to 'sc://h:1/;token=***' failed"),
        ("sc://u:pw@h:1/;token=abc", "sc://***@h:1/;token=***"),
        ("sc://localhost:15002", "sc://localhost:15002"),
        ("https://h/x?Authorization=abc&page=2", "https://h/x?Authorization=***&page=2"),
        ("spark://h:7077;a=b", "spark://h:7077;a=b"),  # not a Connect URL: only named secrets are hidden
    ],
)
def test_spark_connect_parameters_are_hidden_but_the_clients_own_settings_stay(url, shown):
    assert redact(url) == shown
