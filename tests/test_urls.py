from __future__ import annotations

import pytest

from wds_cloud.errors import ConfigError
from wds_cloud.urls import (
    ais_url,
    apply_rewrite_rules,
    expand_urls,
    parse_rewrite_rules,
    redact,
    split_scheme,
)


def test_split_scheme() -> None:
    assert split_scheme("s3://b/k.tar") == ("s3", "//b/k.tar")
    assert split_scheme("pipe:curl -s x") == ("pipe", "curl -s x")
    assert split_scheme("/data/a.tar") == ("", "/data/a.tar")
    assert split_scheme("rel/a:b.tar") == ("", "rel/a:b.tar")
    assert split_scheme("C:\\data\\a.tar") == ("", "C:\\data\\a.tar")
    assert split_scheme("GS://b/k") == ("gs", "//b/k")


def test_expand_braces_and_joins() -> None:
    assert expand_urls("a-{0..2}.tar") == ["a-0.tar", "a-1.tar", "a-2.tar"]
    expected = ["a-00.tar", "a-01.tar", "b-a.tar", "b-b.tar"]
    assert expand_urls("a-{00..01}.tar::b-{a,b}.tar") == expected
    assert expand_urls(["x.tar", "y-{1,2}.tar"]) == ["x.tar", "y-1.tar", "y-2.tar"]


def test_expand_vars() -> None:
    urls = expand_urls("${ROOT}/s-{0..1}.tar", url_vars={"ROOT": "s3://bkt"})
    assert urls == ["s3://bkt/s-0.tar", "s3://bkt/s-1.tar"]
    with pytest.raises(ConfigError, match="WDS_ROOT"):
        expand_urls("${ROOT}/a.tar", url_vars={})


def test_rewrite_rules_first_match_anchored_groups() -> None:
    rules = parse_rewrite_rules(r"gs://=/shared/data/;s3://(\w+)/=http://\1.local/;b=c")
    assert apply_rewrite_rules("gs://bkt/a.tar", rules) == "/shared/data/bkt/a.tar"
    assert apply_rewrite_rules("s3://bkt/a.tar", rules) == "http://bkt.local/a.tar"
    # anchored: "b" does not match in the middle
    assert apply_rewrite_rules("/x/b.tar", rules) == "/x/b.tar"
    assert apply_rewrite_rules("bx", rules) == "cx"


def test_rewrite_rules_malformed_name_the_variable() -> None:
    with pytest.raises(ConfigError, match="GOPEN_REWRITE"):
        parse_rewrite_rules("no-equals-sign", source="GOPEN_REWRITE")
    with pytest.raises(ConfigError, match=r"WDS_REWRITE.*bad rule"):
        parse_rewrite_rules("(unclosed=x")


def test_ais_mapping() -> None:
    ep = "http://127.0.0.1:51080/"
    assert ais_url("gs://b/dir/k.tar", ep) == "http://127.0.0.1:51080/v1/objects/b/dir/k.tar?provider=gcp"
    assert ais_url("s3://b/k.tar", ep).endswith("?provider=aws")
    assert ais_url("az://b/k.tar", ep).endswith("?provider=azure")
    assert ais_url("ais://b/k.tar", ep).endswith("?provider=ais")
    with pytest.raises(ConfigError, match="bucket"):
        ais_url("gs://only-bucket", ep)
    with pytest.raises(ConfigError, match="scheme"):
        ais_url("ftp://h/k", ep)


def test_redact_hides_secrets() -> None:
    url = "https://user:pw@host.example/p/a.tar?X-Amz-Signature=deadbeef&X-Amz-Credential=AKIA"
    out = redact(url)
    assert "pw" not in out and "deadbeef" not in out and "AKIA" not in out
    assert out.startswith("https://***@host.example/p/a.tar?X-Amz-Signature=***")
    assert redact("/local/a.tar") == "/local/a.tar"
