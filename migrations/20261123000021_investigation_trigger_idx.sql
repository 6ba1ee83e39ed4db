-- The investigation loop looks for recent warn/fail verdicts on every tick of every replica.
CREATE INDEX verdicts_bad_recent_idx ON verdicts (judged_at) WHERE verdict IN ('warn', 'fail');
