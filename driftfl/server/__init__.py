"""The ServerApp: compose the experiment, run the strategy, evaluate centrally, record results."""
