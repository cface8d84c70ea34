"""`mlxspec serve`: an OpenAI-compatible HTTP server over the engine's event stream.

- schema.py  request bodies validated into Options and prompts; OpenAI-shaped responses,
             chunks and errors (plain Python, no MLX)
- worker.py  the one thread that runs MLX: generations one at a time, and the prompt cache
- app.py     the routes (Starlette): read, parse, queue on the worker, answer or stream
- tools.py   a request's tools and tool_choice checked (the calls are read by ../tool_calls.py)
- formats.py response_format as the grammar the reply is held to (../grammar.py)
- limits.py  what one client may cost: body size, timeouts, connections; bodies read here
- length.py  a sound lower bound on a text's token count, to refuse one that cannot fit
- encode.py  a request's prompt as ids (refused by length first), on the offload thread
- offload.py the thread that templates and tokenizes, off the event loop
- protocol.py uvicorn's h11 protocol with a header-read timeout and a connection limit
- run.py     listen, start the worker, run uvicorn; Ctrl-C or SIGTERM stops it cleanly
"""
