from specbench.cli.main import main

main()
