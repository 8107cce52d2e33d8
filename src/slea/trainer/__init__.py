"""The trainers (on-policy RL, TeamTR): their loops, the update, the critic and the run's guards."""
