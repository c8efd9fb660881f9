from bmoe_edge.cli import run

run()
