"""`mlxspec serve`: an OpenAI-compatible HTTP server over the engine's event stream.

- schema.py  request bodies validated into Options and prompts; OpenAI-shaped responses,
             chunks and errors (plain Python, no MLX)
- worker.py  the one thread that runs MLX: generations one at a time, and the prompt cache
- app.py     the routes (Starlette): parse, queue on the worker, answer or stream
- run.py     listen, start the worker, run uvicorn; Ctrl-C stops it cleanly
"""
