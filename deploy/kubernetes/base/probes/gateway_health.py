"""Kubelet exec probe for the gateway: a grpc.health.v1 Check over TLS.

Kubernetes' own gRPC probes speak plain text only, and the gateway serves TLS
whenever it listens beyond loopback. The probe verifies the certificate
against the name jobs use, so a gateway whose certificate jobs would refuse
is not ready either.

usage: python gateway_health.py HOST:PORT SERVER_NAME CA_FILE [SERVICE]
Exits 0 when the service (default: the whole server) is SERVING.
"""

from __future__ import annotations

import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

TIMEOUT_SECONDS = 4.0


def main(argv: list[str]) -> int:
    address, server_name, ca_file, *service = argv
    with open(ca_file, "rb") as file:
        credentials = grpc.ssl_channel_credentials(root_certificates=file.read())
    # Connects to this pod's own address but checks the name the certificate
    # was issued for.
    options = [("grpc.ssl_target_name_override", server_name)]
    with grpc.secure_channel(address, credentials, options=options) as channel:
        request = health_pb2.HealthCheckRequest(service=service[0] if service else "")
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(request, timeout=TIMEOUT_SECONDS)
        except grpc.RpcError as error:
            print(f"gateway health: {error.code().name}: {error.details()}", file=sys.stderr)
            return 1
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        print(f"gateway health: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
