"""fedbalance for FedML 0.9.6: armed on ``import fedml``; acts only when the config names an aggregator."""
