#!/usr/bin/env python3
"""forge-cache's gRPC API from Python (`grpcio`), with stubs generated from proto/ at run time.

Streams a Generate call token by token, asks again with CACHE_MODE_EXACT (served from the exact
cache: 0 tokens computed), files a fact with PutFact and gets it back from Generate (FACT) and
SearchFacts, and prints GetStats. `--json` prints one JSON object (the end-to-end tests read it).

    python3 examples/grpc_client.py --server 127.0.0.1:50051 --tenant default

Needs `pip install grpcio grpcio-tools` (or PYTHONPATH=.test-clients/site after
scripts/fetch-test-clients.sh). The stubs are generated into a temporary folder with
grpcio-tools' protoc (no system protoc).
"""
import argparse
import importlib
import json
import os
import shutil
import sys
import tempfile

import grpc
import grpc_tools
from grpc_tools import protoc

SYSTEM = "You are a helpful assistant."
PROTO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "proto")


def load_stubs(out):
    """forge/v1/forge_pb2{,_grpc}.py generated from proto/ into `out`, imported."""
    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    args = ["protoc", f"-I{PROTO_DIR}", f"-I{include}", f"--python_out={out}", f"--grpc_python_out={out}",
            os.path.join(PROTO_DIR, "forge", "v1", "forge.proto")]
    if protoc.main(args) != 0:
        sys.exit("generating the stubs from proto/ failed")
    sys.path.insert(0, out)
    return importlib.import_module("forge.v1.forge_pb2"), importlib.import_module("forge.v1.forge_pb2_grpc")


def generate(stub, pb, metadata, **fields):
    """One streamed Generate call: (text, pieces, outcome)."""
    text, pieces, outcome = "", 0, None
    for msg in stub.Generate(pb.GenerateRequest(**fields), metadata=metadata):
        text += msg.text
        pieces += bool(msg.text)
        if msg.HasField("outcome"):
            outcome = msg.outcome
    return text, pieces, outcome


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", default="127.0.0.1:50051", help="HOST:PORT of forge-cache serve")
    ap.add_argument("--tenant", default="default")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="forge-stubs-")
    try:
        pb, rpc = load_stubs(tmp)
        stub = rpc.ForgeStub(grpc.insecure_channel(a.server))
        md = [("x-forge-tenant", a.tenant)]
        name = lambda v: pb.ServedFrom.Name(v)

        ask = dict(system=SYSTEM, prompt="What is the capital of France?", max_tokens=32)
        text, pieces, o = generate(stub, pb, md, **ask)
        exact_text, _, e = generate(stub, pb, md, cache_mode=pb.CACHE_MODE_EXACT, **ask)

        put = stub.PutFact(pb.PutFactRequest(question="Which river flows through Paris?", content="The Seine."), metadata=md)
        fact_text, _, f = generate(stub, pb, md, system=SYSTEM, prompt="Which river flows through Paris?", max_tokens=16)
        found = stub.SearchFacts(pb.SearchFactsRequest(query="Seine"), metadata=md).facts
        stats = stub.GetStats(pb.GetStatsRequest(), metadata=md)

        out = {
            "generate": {"text": text, "pieces": pieces, "served_from": name(o.served_from),
                         "prompt_tokens": len(o.prompt_token_ids), "completion_tokens": o.completion_tokens,
                         "tokens_computed": o.tokens_computed, "inference_id": o.inference_id},
            "exact": {"text": exact_text, "served_from": name(e.served_from), "tokens_computed": e.tokens_computed,
                      "source_inference_id": e.source_inference_id},
            "fact": {"id": put.fact.id, "text": fact_text, "served_from": name(f.served_from), "source_fact_id": f.source_fact_id},
            "search": [{"id": x.id, "content": x.content} for x in found],
            "stats": {"requests": stats.requests, "tiers": {name(t.served_from): t.requests for t in stats.tiers if t.requests}},
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if a.json:
        print(json.dumps(out))
        return
    g = out["generate"]
    print(f"Generate [{g['served_from']}] in {g['pieces']} pieces: {g['text']!r}")
    print(f"again with CACHE_MODE_EXACT [{out['exact']['served_from']}], {out['exact']['tokens_computed']} tokens computed")
    print(f"PutFact #{out['fact']['id']}, then Generate [{out['fact']['served_from']}]: {out['fact']['text']!r}")
    print(f"SearchFacts 'Seine': {[x['content'] for x in out['search']]}")
    print(f"GetStats: {out['stats']}")


if __name__ == "__main__":
    main()
