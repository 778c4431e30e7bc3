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

    many = client.completions.create(
        model=model, prompt=["ROMEO:", "JULIET:"], n=2, max_tokens=4, temperature=0
    )
    indexes = sorted(c.index for c in many.choices)
    check("prompt list with n = 2", indexes == [0, 1, 2, 3], many)
    check("n greedy choices agree", many.choices[0].text == many.choices[1].text, many)
    check("n usage sums choices", many.usage.completion_tokens == 16, many.usage)

    streamed = {}
    for chunk in client.chat.completions.create(
        model=model, messages=messages, max_tokens=4, temperature=0, n=2, stream=True
    ):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + (c.delta.content or "")
    check("chat stream with n = 2", sorted(streamed) == [0, 1], streamed)

    scored = client.completions.create(
        model=model, prompt="ROMEO:", max_tokens=4, temperature=0, logprobs=2
    )
    lp = scored.choices[0].logprobs
    check(
        "completions logprobs",
        len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == 4
        and all(len(t) >= 2 for t in lp.top_logprobs),
        lp,
    )
    chat_scored = client.chat.completions.create(
        model=model, messages=messages, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3
    )
    content = chat_scored.choices[0].logprobs.content
    check(
        "chat logprobs",
        len(content) == 4 and all(len(e.top_logprobs) == 3 for e in content),
        content,
    )
    lp_pieces = []
    for chunk in client.chat.completions.create(
        model=model, messages=messages, max_tokens=4, temperature=0, logprobs=True, stream=True
    ):
        for c in chunk.choices:
            if c.logprobs and c.logprobs.content:
                lp_pieces.extend(e.token for e in c.logprobs.content)
    check("chat stream logprobs", lp_pieces == [e.token for e in content], lp_pieces)

    echoed = client.completions.create(
        model=model, prompt="ROMEO:", max_tokens=4, temperature=0, echo=True
    )
    check("echo", echoed.choices[0].text.startswith("ROMEO:"), echoed)
    pieces = []
    for chunk in client.completions.create(
        model=model, prompt="ROMEO:", max_tokens=4, temperature=0, echo=True, stream=True
    ):
        pieces.extend(c.text for c in chunk.choices)
    check("echo stream", "".join(pieces) == echoed.choices[0].text, pieces)

    try:
        client.completions.create(model=model, prompt="ROMEO:", n=17)
        check("n = 17 raises", False, "no exception")
    except openai.BadRequestError as e:
        check("n = 17 raises", e.param == "n", e)

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
