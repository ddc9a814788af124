from .cli.main import main

main(prog_name="python -m runifold_sync")
