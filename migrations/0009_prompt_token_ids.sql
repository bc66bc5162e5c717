-- 0009: a computed answer that the exact cache may replay keeps its prompt's token ids (JSON
-- array, like response_tokens), so a restarted service answers an EXACT hit with the outcome's
-- prompt_token_ids before the model's tokenizer has been built. NULL on other rows and on rows
-- written before this migration (their hits tokenize the prompt, as before).
ALTER TABLE inferences ADD COLUMN prompt_token_ids TEXT;
