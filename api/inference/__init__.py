"""The inference path behind api/routes/completions.py (api/inference/serve.py runs it), one job per module, in the order a request runs:

  prepare.py  parse the body, refuse what cannot be honoured, resolve the model, tokenize, size-check,
              rate-limit -> a `Prepared` request
  predict.py  the output-length prediction (services.predictor: settings.predictor.length_predictor), carried to the
              router, the worker (GenerateRequest.predicted_output_tokens) and the usage row, with its inputs
  learned_predictor.py  the default predictor: the trained model hot-reloaded from the blob store, fed with
              each finished request's true length
  route.py    wait through a cold start, route to a worker and read its first event (refusals -> HTTP errors)
  respond.py  the response: SSE framing for streams, the collector for non-streamed requests
  schemas.py  the OpenAI-compatible request bodies (CompletionRequest, ChatCompletionRequest)
Metering (one usage row per request) is api/metering.py.
"""
