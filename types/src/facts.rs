//! Node facts: what the agent reports about its hardware and software.
