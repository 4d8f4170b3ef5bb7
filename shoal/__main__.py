from shoal.cli.app import main

main()
