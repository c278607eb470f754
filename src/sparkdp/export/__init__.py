"""Trained models out in the format the Hugging Face ecosystem opens.

:mod:`.record` (which model a state dict belongs to), :mod:`.gpt2` (the built-in gpt as
GPT-2), :mod:`.pretrained` (``save_pretrained``), :mod:`.from_checkpoint` (``sparkdp export``).
Nothing is imported here, so that the training loop's import of :mod:`.record` stays light.
"""
