from mlc.cli import main

main()
