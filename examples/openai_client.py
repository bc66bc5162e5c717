#!/usr/bin/env python3
"""forge-cache's OpenAI-compatible HTTP API from the official `openai` package.

Asks the same chat question twice (the model answers the first, the exact cache the repeat:
`served_from` says which), streams a longer answer chunk by chunk with the usage at the end,
and runs a plain completion. Prints what it saw; `--json` prints one JSON object instead (the
end-to-end tests read it).

    python3 examples/openai_client.py --base-url http://127.0.0.1:8080/v1

Needs `pip install openai` (or PYTHONPATH=.test-clients/site after scripts/fetch-test-clients.sh).
With `serve --tenants FILE`, pass a tenant's key as --api-key (sent as `Authorization: Bearer`).
"""
import argparse
import json
import time

from openai import OpenAI

SYSTEM = "You are a helpful assistant."


def extra(obj, name):
    """An extra field forge-cache adds to OpenAI's JSON (pydantic keeps unknown fields)."""
    return (obj.model_extra or {}).get(name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    ap.add_argument("--api-key", default="unused-without-a-tenants-file")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args()
    client = OpenAI(base_url=a.base_url, api_key=a.api_key, max_retries=0)
    model = client.models.list().data[0].id

    question = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is the capital of France?"}]
    first = client.chat.completions.create(model=model, messages=question, max_tokens=32, temperature=0)
    # The same request again, reading the response headers too.
    raw = client.chat.completions.with_raw_response.create(model=model, messages=question, max_tokens=32, temperature=0)
    again = raw.parse()

    # A streamed answer, computed by the model (x-forge-cache-mode: bypass), usage at the end.
    story = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Write a short story about a robot who learns to paint."}]
    pieces, times, usage, served = [], [], None, None
    stream = client.chat.completions.create(
        model=model, messages=story, max_tokens=48, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_headers={"x-forge-cache-mode": "bypass"},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
            times.append(time.monotonic())
        if chunk.usage is not None:
            usage = chunk.usage
        served = extra(chunk, "served_from") or served

    completion = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0)

    out = {
        "model": model,
        "first": {"text": first.choices[0].message.content, "served_from": extra(first, "served_from"),
                  "finish_reason": first.choices[0].finish_reason, "usage": first.usage.model_dump()},
        "again": {"text": again.choices[0].message.content, "served_from": extra(again, "served_from"),
                  "header_served_from": raw.headers.get("x-forge-served-from"), "usage": again.usage.model_dump()},
        "stream": {"text": "".join(pieces), "chunks": len(pieces), "span_s": (times[-1] - times[0]) if times else 0.0,
                   "served_from": served, "usage": usage.model_dump() if usage else None},
        "completion": {"text": completion.choices[0].text, "served_from": extra(completion, "served_from")},
    }
    if a.json:
        print(json.dumps(out))
        return
    print(f"model: {model}")
    print(f"first  [{out['first']['served_from']}]: {out['first']['text']!r}")
    print(f"again  [{out['again']['served_from']}]: {out['again']['text']!r}")
    s = out["stream"]
    print(f"stream [{s['served_from']}]: {s['chunks']} chunks over {s['span_s']:.2f} s, usage {s['usage']}")
    print(f"completion [{out['completion']['served_from']}]: {out['completion']['text']!r}")


if __name__ == "__main__":
    main()
