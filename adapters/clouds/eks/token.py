"""The bearer token EKS accepts: a presigned STS GetCallerIdentity URL naming the cluster.

Same construction as aws-cli `awscli/customizations/eks/get_token.py`: the cluster name travels as the
`x-k8s-aws-id` header, which must be covered by the signature so the token cannot be replayed against
another cluster. boto3 has no parameter for that header, so two event handlers move it from the call's
params into the request before signing.
"""

from __future__ import annotations

import base64
from datetime import timedelta
from typing import Any

K8S_AWS_ID_HEADER = "x-k8s-aws-id"
TOKEN_PREFIX = "k8s-aws-v1."
# The presigned URL is valid for 60 s of signing time; EKS honours it for 15 minutes after that,
# and aws-cli reports 14 so clients refresh before the server refuses it.
URL_TIMEOUT_SECONDS = 60
TOKEN_LIFETIME = timedelta(minutes=14)

_PARAMS_EVENT = "provide-client-params.sts.GetCallerIdentity"
_SIGN_EVENT = "before-sign.sts.GetCallerIdentity"


def _retrieve_k8s_aws_id(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
    if K8S_AWS_ID_HEADER in params:
        context[K8S_AWS_ID_HEADER] = params.pop(K8S_AWS_ID_HEADER)


def _inject_k8s_aws_id_header(request: Any, **_: Any) -> None:
    if K8S_AWS_ID_HEADER in request.context:
        request.headers[K8S_AWS_ID_HEADER] = request.context[K8S_AWS_ID_HEADER]


def register_k8s_aws_id_handlers(sts_client: Any) -> None:
    # unique_id keeps a cached client from collecting one copy of each handler per token.
    events = sts_client.meta.events
    events.register(_PARAMS_EVENT, _retrieve_k8s_aws_id, unique_id="gpufleet-k8s-aws-id-params")
    events.register(_SIGN_EVENT, _inject_k8s_aws_id_header, unique_id="gpufleet-k8s-aws-id-header")


def eks_token(sts_client: Any, cluster_name: str) -> str:
    """`k8s-aws-v1.` + unpadded base64url of the presigned URL, as `aws eks get-token` prints."""
    register_k8s_aws_id_handlers(sts_client)
    url: str = sts_client.generate_presigned_url(
        "get_caller_identity",
        Params={K8S_AWS_ID_HEADER: cluster_name},
        ExpiresIn=URL_TIMEOUT_SECONDS,
        HttpMethod="GET",
    )
    return TOKEN_PREFIX + base64.urlsafe_b64encode(url.encode()).decode().rstrip("=")
