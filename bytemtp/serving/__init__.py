"""Serving a model over HTTP: continuous batching of requests (`engine`), the OpenAI completions
protocol over bytes (`protocol`), the aiohttp server (`app`) and the load it is measured under
(`load`)."""
