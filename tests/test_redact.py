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


def test_storage_options_are_hidden_by_their_names_at_any_depth():
    options = {
        "key": "AKIAKEYID",
        "secret": "S3CR3T",
        "token": "T0K3N",
        "endpoint_url": "http://minio:9000",
        "anon": False,
        "client_kwargs": {
            "region_name": "eu-west-1",
            "aws_access_key_id": "AKIA2",
            "aws_secret_access_key": "SECRET2",
            "aws_session_token": "SESSION2",
        },
        "s3_additional_kwargs": {"SSECustomerKey": "SSEKEY"},
        "credentials": {"SecretAccessKey": "x", "SessionToken": "y"},  # a whole dict under a secret name
        "account_key": 123,  # whatever the type
        "connection_string": "DefaultEndpointsProtocol=https;AccountKey=AZKEY",
        "password": None,  # nothing given: nothing to hide, and the log says so
        "chain": [{"sas_token": "SAS"}],
    }
    assert redact({"checkpoint_storage_options": options, "epochs": 2}) == {
        "checkpoint_storage_options": {
            "key": "***",
            "secret": "***",
            "token": "***",
            "endpoint_url": "http://minio:9000",
            "anon": False,
            "client_kwargs": {
                "region_name": "eu-west-1",
                "aws_access_key_id": "***",
                "aws_secret_access_key": "***",
                "aws_session_token": "***",
            },
            "s3_additional_kwargs": {"SSECustomerKey": "***"},
            "credentials": "***",
            "account_key": "***",
            "connection_string": "***",
            "password": None,
            "chain": [{"sas_token": "***"}],
        },
        "epochs": 2,
    }


@pytest.mark.parametrize(
    "name", ["pad_token_id", "tokens_per_s", "tokenizer", "keep_checkpoints", "max_tokens", "monkey", "keys"]
)
def test_names_that_only_mention_a_token_or_a_key_are_shown(name):
    assert redact({name: 7}) == {name: 7}
