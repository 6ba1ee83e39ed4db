-- Results are found by arrival time when the judge catches up on ones it has not judged.
CREATE INDEX results_received_idx ON results (received_at);
