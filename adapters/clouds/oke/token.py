"""The bearer token OKE accepts, built in-process instead of running `oci ce cluster generate-token`.

Same construction as oci-cli's `generate_token`: sign a GET of
`https://containerengine.<region>.oraclecloud.com/cluster_request/<cluster id>` with the caller's OCI
signer, move the signature's `authorization` and `date` headers into that URL's query, and base64url it.
OKE re-verifies the signature, so the token proves the caller's identity without sharing its key.
"""

from __future__ import annotations

import base64
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

from oci._vendor import requests as oci_requests

# oci-cli tells kubectl to refresh after 4 minutes; OKE refuses the signature once its date is 5 minutes old.
TOKEN_LIFETIME = timedelta(minutes=4)


def cluster_request_url(region: str, cluster_id: str) -> str:
    return f"https://containerengine.{region}.oraclecloud.com/cluster_request/{cluster_id}"


def oke_token(signer: Any, region: str, cluster_id: str) -> str:
    url = cluster_request_url(region, cluster_id)
    # The SDK's own (vendored) requests, because that is the request type its signer knows how to sign.
    signed = signer.do_request_sign(oci_requests.Request("GET", url).prepare())
    query = {"authorization": signed.headers["authorization"], "date": signed.headers["date"]}
    # A delegation-token signer (instance principals acting for a user) must pass its token along.
    delegation = getattr(signer, "delegation_token", None)
    if delegation:
        query["opc-obo-token"] = delegation
    return base64.urlsafe_b64encode(f"{url}?{urlencode(query)}".encode()).decode()
