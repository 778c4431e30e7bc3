"""Drives a running `nanoserve serve` with the official `openai` Python client.

Usage: python tools/openai_client_check.py BASE_URL MODEL API_KEY

Checks that the client library understands every answer: the model list, completions and chat
completions (whole and streamed, with usage), and errors raised as the library's exception
classes with the field named. Prints one line per check; exits non-zero on the first failure.
"""

import sys

import openai


def check(name, ok, detail=""):
    if not ok:
        print(f"FAILED {name}: {detail}")
        sys.exit(1)
    print(f"ok {name}")


def main():
    base_url, model, api_key = sys.argv[1:4]
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0)

    models = client.models.list()
    check("models.list", [m.id for m in models.data] == [model], models)
    one = client.models.retrieve(model)
    check("models.retrieve", one.id == model and one.object == "model", one)
    try:
        client.models.retrieve("no-such-model")
        check("models.retrieve unknown", False, "no error")
    except openai.NotFoundError as e:
        check("models.retrieve unknown", e.status_code == 404, e)
    raw = client.models.with_raw_response.list(extra_headers={"X-Request-Id": "check-1"})
    check("X-Request-Id echoed", raw.headers.get("x-request-id") == "check-1", raw.headers)

    whole = client.completions.create(
        model=model, prompt="ROMEO:\n", max_tokens=6, temperature=0
    )
    choice = whole.choices[0]
    check("completions.create", choice.finish_reason in ("length", "stop"), whole)
    check(
        "completions usage",
        whole.usage.completion_tokens >= 1
        and whole.usage.total_tokens
        == whole.usage.prompt_tokens + whole.usage.completion_tokens,
        whole.usage,
    )

    pieces, usage = [], None
    for chunk in client.completions.create(
        model=model,
        prompt="ROMEO:\n",
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    ):
        pieces.extend(c.text for c in chunk.choices)
        usage = chunk.usage or usage
    check("completions stream", "".join(pieces) == choice.text, (pieces, choice.text))
    check("completions stream usage", usage == whole.usage, (usage, whole.usage))

    messages = [
        {"role": "system", "content": "Speak as a Veronese."},
        {"role": "user", "content": "Who goes there?"},
    ]
    chat = client.chat.completions.create(
        model=model, messages=messages, max_tokens=8, temperature=0, seed=3
    )
    message = chat.choices[0].message
    check("chat.completions.create", message.role == "assistant", chat)

    pieces = []
    for chunk in client.chat.completions.create(
        model=model, messages=messages, max_tokens=8, temperature=0, stream=True
    ):
        pieces.extend(c.delta.content or "" for c in chunk.choices)
    check("chat stream", "".join(pieces) == message.content, (pieces, message.content))

    try:
        client.completions.create(model=model, prompt="ROMEO:", temperature=-1)
        check("bad temperature raises", False, "no exception")
    except openai.BadRequestError as e:
        check("bad temperature raises", e.status_code == 400 and e.param == "temperature", e)

    try:
        client.completions.create(model=model, prompt="ROMEO:", n=2)
        check("n = 2 raises", False, "no exception")
    except openai.BadRequestError as e:
        check("n = 2 raises", e.param == "n", e)

    try:
        client.completions.create(model="gpt-9", prompt="ROMEO:")
        check("unknown model raises", False, "no exception")
    except openai.NotFoundError as e:
        check("unknown model raises", e.param == "model", e)

    wrong_key = openai.OpenAI(base_url=f"{base_url}/v1", api_key="wrong", max_retries=0)
    try:
        wrong_key.models.list()
        check("wrong key raises", False, "no exception")
    except openai.AuthenticationError as e:
        check("wrong key raises", e.status_code == 401, e)

    print("all openai client checks passed")


if __name__ == "__main__":
    main()
