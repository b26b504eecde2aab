"""Request -> Features: prompt size (tokens, the conversation memo), and the task (identity, tracker, context, vector)."""
