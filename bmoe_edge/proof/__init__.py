"""Proof: the byte-identity gates (streamed == resident, token ids and logits) over the fixtures."""
