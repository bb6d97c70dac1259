from psctl.cli import main

main()
