-- 0009 (PostgreSQL twin of migrations/0009_prompt_token_ids.sql): a computed answer that the
-- exact cache may replay keeps its prompt's token ids (JSON array, like response_tokens), so an
-- EXACT hit is answered without the model's tokenizer. NULL on other rows and older rows.
ALTER TABLE inferences ADD COLUMN prompt_token_ids TEXT;
